"""The instance's measurements: the emulated cost server."""
import pytest


def test_emulated_cost_serves_a_queue_back_to_back_and_starts_afresh_after_idle():
    """The emulated server (``cost=``): a batch already queued when the last one was served
    starts its service at that moment, however late the event loop comes back to it, so
    a shared loop does not slow an instance below 1 / cost; one taken from an empty
    queue starts when it is taken; no batch is ever done before its service time."""
    import asyncio
    import collections
    import time
    from streamlb._worker._metrics import CostServer

    async def go():
        inst = CostServer()
        queue = collections.deque(["queued"] * 2)
        starts, ends = [], []
        for _ in range(3):
            t1 = time.perf_counter()
            starts.append(await inst.serve(0.02, t1, more=bool(queue)))
            ends.append(time.perf_counter())
            assert ends[-1] >= starts[-1] + 0.02             # never done early
            time.sleep(0.03)             # the loop is busy elsewhere before the next batch
            if queue:
                queue.popleft()
        # the second and third were queued: each began when the one before was served
        assert starts[1] == pytest.approx(starts[0] + 0.02, abs=1e-9)
        assert starts[2] == pytest.approx(starts[1] + 0.02, abs=1e-9)
        assert inst.served_until is None                    # the queue ran dry
        t1 = time.perf_counter()
        assert await inst.serve(0.02, t1, more=bool(queue)) == t1   # afresh after idle
        assert await inst.serve(0.0, t1, more=bool(queue)) == t1    # no cost, no wait

    asyncio.run(go())


def test_an_instance_keeps_only_the_newest_metrics_windows(tmp_path):
    """``streamlb.metrics-windows`` bounds what each instance keeps for ``Job.metrics()``:
    an unbounded job's metrics no longer grow for ever (the soak's workers grew with them).
    A real LocalCluster worker process; 0.05 s windows over a ~2 s stream, 5 kept."""
    import dask
    import numpy as np
    import pandas as pd
    from distributed import Client, LocalCluster
    from streamz import Stream

    import streamlb

    df = pd.DataFrame({"key": np.arange(20_000) % 50, "value": 1.0})
    df.to_parquet(tmp_path / "in.parquet")
    with dask.config.set({"streamlb.metrics-windows": 5}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as client:
        src = Stream.from_parquet(str(tmp_path / "in.parquet"), batch_size=500, rate=10_000)
        src.key_by("key").aggregate({"n": ("value", "count")}, name="agg", parallelism=2)
        with streamlb.run(src, client=client, window=0.05) as job:
            job.wait(timeout=60)
            per_instance = job.metrics().groupby(["operator", "instance"]).size()
            assert job.state("agg")["n"].sum() == len(df)
    assert per_instance.max() == 5, per_instance     # ~40 windows went by; the newest 5 kept
