"""Window state moves live: every migration strategy, rescale, exact against pandas."""
from __future__ import annotations

import time

import numpy as np
import pytest
from streamz import Stream

import streamlb
from streamlb import MigrationError
from streamlb.keygroups import assign_to_key_group

from test_windows import SPEC, WINDOWS, late_frame
from windowing import check, emitted, expected

pytestmark = pytest.mark.spark

G = 64
STRATEGIES = ["all-at-once", "fluid", "lazy", "pause"]


def paced(path, kind, delay, parallelism=4):
    src = Stream.from_parquet(path, batch_size=250, rate=30_000).with_watermark("event_time", delay=delay)
    op = src.key_by("key").window(**WINDOWS[kind][0]).aggregate(SPEC, parallelism=parallelism, name="w")
    out, late = [], []
    op.sink(out.append)
    op.late().sink(late.append)
    return src, out, late


def swap_half(job) -> dict:
    """Every other key group of each instance to the next instance."""
    table = job.routing("w")
    n = table.parallelism
    return {g: (i + 1) % n for i in range(n) for g in table.key_groups_of(i)[::2]}


@pytest.mark.parametrize("delay", ["0s", "3s"])
@pytest.mark.parametrize("kind", ["tumbling", "session"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windows_exact_across_live_migrations(two_workers, disordered, disordered_frame, strategy, kind, delay):
    src, out, late = paced(disordered, kind, delay)
    moved = 0
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="static") as job:
        for _ in range(2):
            time.sleep(0.5)
            try:
                job.reassign("w", swap_half(job), strategy=strategy)
                moved += 1
            except MigrationError as exc:       # the stream ended first
                assert "it cannot take part" in str(exc)
        job.wait(timeout=120)
    assert moved >= 1
    lf = late_frame(late)
    if delay == "3s":
        assert lf is None, "a record was called late although the delay covers the disorder"
    check(emitted(out), expected(disordered_frame, kind, lf, **WINDOWS[kind][1]))


@pytest.mark.parametrize("kind", ["hopping", "session"])
def test_windows_exact_across_live_rescales(two_workers, disordered, disordered_frame, kind):
    src, out, late = paced(disordered, kind, "3s")
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="static") as job:
        for n in (6, 3):
            time.sleep(0.5)
            job.rescale("w", n)
        job.wait(timeout=120)
    assert late == []
    check(emitted(out), expected(disordered_frame, kind, **WINDOWS[kind][1]))


# -- exactly once across a SIGKILLed `dask worker` --------------------------------------------
@pytest.fixture(scope="module")
def cluster3():
    from distributed import Client

    from conftest import dask_cli_cluster

    with dask_cli_cluster(workers=3) as address, Client(address) as c:
        yield c


@pytest.mark.cluster
@pytest.mark.parametrize("kind,delay", [("tumbling", "0s"), ("session", "3s")])
def test_window_outputs_exactly_once_across_a_sigkill(cluster3, disordered, disordered_frame, tmp_path, kind, delay):
    import pandas as pd

    from test_checkpoint import _kill_one

    cluster3.wait_for_workers(3, timeout=60)
    src = Stream.from_parquet(disordered, batch_size=250, rate=30_000).with_watermark("event_time", delay=delay)
    op = src.key_by("key").window(**WINDOWS[kind][0]).aggregate(SPEC, parallelism=3, name="w")
    op.to_parquet(str(tmp_path / "out"))
    op.late().to_parquet(str(tmp_path / "late"))
    job = streamlb.run(src, client=cluster3, checkpoint=str(tmp_path / "ck"), checkpoint_interval=0.3)
    time.sleep(1.0)
    victim = _kill_one(cluster3, job)
    job.wait(timeout=180)
    recoveries = [h for h in job.history if h.get("kind") == "recovery"]
    assert len(recoveries) == 1 and recoveries[0]["lost_workers"] == [victim]
    job.stop()
    got = pd.read_parquet(tmp_path / "out")
    late = pd.read_parquet(tmp_path / "late") if (tmp_path / "late").exists() else None
    if late is not None and not len(late):
        late = None
    if delay == "3s":
        assert late is None
    check(emitted([got]), expected(disordered_frame, kind, late, **WINDOWS[kind][1]))


@pytest.mark.parametrize("kind", ["tumbling", "hopping"])
def test_a_split_hot_key_of_a_window_aggregate_is_exact(two_workers, disordered, disordered_frame, kind):
    """The hottest key spread over every instance (with the hybrid balancer watching):
    partial aggregates per key and pane merged at the key's home, each window fired once,
    nothing late (the delay covers the disorder)."""
    hot = int(disordered_frame.key.value_counts().index[0])
    src, out, late = paced(disordered, kind, "3s")
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="hybrid") as job:
        time.sleep(0.4)
        home = int(job.routing("w").owners[assign_to_key_group(np.array([hot]), G)[0]])
        job.split("w", hot, [i for i in range(4) if i != home])
        job.wait(timeout=120)
        metrics = job.metrics()
    assert late == []
    check(emitted(out), expected(disordered_frame, kind, **WINDOWS[kind][1]))
    assert metrics[metrics.operator == "w"].split_records.sum() > 0


def test_splitting_a_session_window_key_is_refused(two_workers, disordered):
    src, out, late = paced(disordered, "session", "3s")
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="static") as job:
        with pytest.raises(MigrationError, match="'w' is a window: only the keys of an aggregate, or of a tumbling "
                                                 "or hopping window aggregate"):
            job.split("w", 1, [0, 1])
        job.wait(timeout=120)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_windows_exact_while_autoflow_balances(two_workers, disordered, disordered_frame, strategy):
    """The autoflow balancer moves key groups by itself (skewed keys, short load windows),
    with each strategy: nothing late with a delay covering the disorder, every window
    exact and fired once."""
    src, out, late = paced(disordered, "tumbling", "3s")
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="autoflow", window=0.2,
                      migration=strategy) as job:
        job.wait(timeout=120)
        moves = [h for h in job.history if h.get("operator") == "w" and "kind" not in h]
    assert moves, "autoflow moved nothing"
    assert {h["strategy"] for h in moves} == {strategy}
    assert late == []
    check(emitted(out), expected(disordered_frame, "tumbling", **WINDOWS["tumbling"][1]))


def test_hybrid_splits_a_hot_window_key_by_itself(two_workers, disordered, disordered_frame):
    """``hybrid`` (splitting keys above a fifth of the mean instance load) splits hot keys of
    a tumbling window aggregate on its own: each window fired once at the key's home,
    exact, nothing late."""
    src, out, late = paced(disordered, "tumbling", "3s")
    with streamlb.run(src, client=two_workers, key_groups=G, balancer="hybrid", window=0.2,
                      balancer_options={"split_at": 0.2, "piece": 0.15, "merge_below": 0.1}) as job:
        job.wait(timeout=120)
        splits = [h for h in job.history if h.get("strategy") == "split" and h.get("splits")]
        metrics = job.metrics()
    assert splits, "hybrid split no key"
    assert metrics[metrics.operator == "w"].split_records.sum() > 0
    assert late == []
    check(emitted(out), expected(disordered_frame, "tumbling", **WINDOWS["tumbling"][1]))
