"""Shuffle balancing for stateless stages: round_robin, jsq and osg deliver every record
exactly once, osg learns costs per feature, bad settings are named."""
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError
from streamlb._shuffle import CostSketch, ShuffleRouter


def records(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 20, n)
    secs = np.where(kind < 3, 2e-4, 1e-6)          # three expensive kinds
    return pd.DataFrame({"id": np.arange(n), "kind": kind, "secs": secs})


@pytest.mark.parametrize("balancer", ["round_robin", "jsq", "osg"])
def test_every_record_arrives_once(client, balancer):
    df = records()
    src = Stream.from_iterable(df.to_dict("records"))
    out = src.rebalance(parallelism=3, balancer=balancer, feature="kind", cost="secs", group=50).sink_to_list()
    with streamlb.run(src, client=client, batch_size=500) as job:
        job.wait(timeout=120)
        m = job.metrics()
    got = pd.concat(out).sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, df, check_dtype=False)
    reb = m[m.operator == "rebalance"]
    assert reb.records.sum() == len(df)
    assert reb.latency_mean_ms.notna().any()


def test_osg_router_learns_costs_and_splits_a_batch_by_them():
    """Sketches fed with known per-kind costs: the router's estimates equal them, and a batch
    is cut so that every instance gets about the same estimated work."""
    costs = np.exp(np.random.default_rng(1).normal(0, 1, 40)) * 1e-4
    sk = CostSketch()
    sk.add(np.arange(40), costs * 500, np.full(40, 500.0))
    r = ShuffleRouter("osg", 4, "kind", group=16, min_records=100)
    r.in_flight[0] += 1
    r.done(0, 0.0, sk.snapshot())
    np.testing.assert_allclose(r._estimate(np.arange(40)), costs, rtol=1e-9)
    df = pd.DataFrame({"kind": np.random.default_rng(2).integers(0, 40, 4000)})
    pieces = r.route(df, "s")
    assert sorted(np.concatenate([p.index.to_numpy() for _, p, _ in pieces]).tolist()) == list(range(4000))
    work = np.array([costs[p["kind"]].sum() for _, p, _ in pieces])
    assert len(pieces) == 4 and work.max() / work.mean() < 1.05
    # round-robin by count would not be even: the same batch cut in 4 equal slices
    rr = np.array([costs[df["kind"].to_numpy()[i::4]].sum() for i in range(4)])
    assert work.max() <= rr.max()


def test_jsq_sends_to_the_instance_with_fewest_batches_in_flight():
    r = ShuffleRouter("jsq", 3)
    df = pd.DataFrame({"x": [1, 2]})
    assert [r.route(df, "s")[0][0] for _ in range(3)] == [0, 1, 2]
    r.done(1, 2.0, None)                 # instance 1 finished its batch
    assert r.route(df, "s")[0][0] == 1


def test_bad_shuffle_settings_are_named(client):
    src = Stream.from_iterable([{"a": 1}])
    with pytest.raises(PipelineError, match="unknown shuffle balancer 'fastest'; valid ones are round_robin, jsq, osg"):
        src.rebalance(balancer="fastest")
    with pytest.raises(PipelineError, match=r"rebalance\(balancer='osg'\) needs feature="):
        src.rebalance(balancer="osg")
    src2 = Stream.from_iterable([{"a": 1, "b": 2}] * 10)
    src2.rebalance(balancer="osg", feature="nope").sink(print)
    with streamlb.run(src2, client=client) as job:
        with pytest.raises(PipelineError, match="feature column 'nope' is not in the batch; columns are"):
            job.wait(timeout=60)
