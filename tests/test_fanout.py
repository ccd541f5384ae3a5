"""One keyed stream feeding several keyed operators, each balanced and migrated on its own."""
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb import PipelineError, planner
from test_pipeline import running_count

AGG = {"n": ("value", "count"), "s": ("value", "sum")}


def _plan(fan_out: bool):
    src = Stream.from_iterable([pd.DataFrame({"key": [1, 2], "value": [1.0, 2.0]})])
    ks = src.key_by("key")
    ks.aggregate(AGG, name="agg")
    ks = ks if fan_out else src.key_by("key")
    out = ks.stateful_map(running_count, name="sm").sink_to_list()
    return planner.plan(src, workers=2, key_groups=16, batch_size=100), out


def test_a_keyed_stream_plans_one_stage_per_operator():
    """Fan-out plans exactly as one key_by per operator does (the shape checkpoints,
    restore, rescale and the plugin already handle): one keyed exchange into each."""
    plan, _ = _plan(fan_out=True)
    agg, sm = plan.stage("agg"), plan.stage("sm")
    assert (agg.upstream, sm.upstream) == (0, 0) and agg.exchange == sm.exchange == "keyed"
    assert [(s.kind, s.target) for s in plan.stages[0].children] == [("exchange", agg.id), ("exchange", sm.id)]
    shape = lambda p: [(s.id, s.name, s.kind, s.upstream, s.exchange, s.key, s.parallelism, s.spec,  # noqa: E731
                        [(c.kind, c.target) for c in s.children]) for s in p.stages]
    assert shape(plan) == shape(_plan(fan_out=False)[0])


@pytest.mark.parametrize("after, named", [
    (lambda ks: ks.map(len), "<map: len>"),
    (lambda ks: ks.filter(bool, stream_name="keep"), "<keep; filter: bool>"),
    (lambda ks: ks.rebalance(), "<rebalance>"),
])
def test_anything_but_a_keyed_operator_after_key_by_is_refused_by_name(after, named):
    src = Stream.from_iterable([{"key": 1, "value": 1.0}])
    ks = src.key_by("key")
    ks.aggregate(AGG, name="agg")
    node = after(ks)  # noqa: F841 (streamz links downstream nodes weakly)
    with pytest.raises(PipelineError, match=rf"key_by\('key'\) is followed by node {named}; after key_by come only "
                                            r"keyed operators: \.aggregate\(spec\), \.stateful_map\(func\)"):
        planner.plan(src, workers=1, key_groups=16, batch_size=100)


def test_a_key_by_followed_by_nothing_is_refused():
    src = Stream.from_iterable([{"key": 1, "value": 1.0}])
    src.map(lambda r: r).key_by("key")
    with pytest.raises(PipelineError, match=r"key_by\('key'\) is followed by no keyed operator; after key_by come "
                                            r"only keyed operators: \.aggregate"):
        planner.plan(src, workers=1, key_groups=16, batch_size=100)


@pytest.mark.spark
def test_fan_out_after_key_by_is_exact_while_autoflow_migrates_each_operator(two_workers, zipf_path, zipf_frame):
    """An aggregate and a stateful_map read one key_by over drifting Zipf data; autoflow
    balances each operator's table on its own, moving key groups live, and both final
    states equal pandas."""
    src = Stream.from_parquet(zipf_path, batch_size=5_000, rate=150_000)
    ks = src.key_by("key")
    ks.aggregate(AGG, parallelism=3, name="agg")
    ks.stateful_map(running_count, parallelism=3, name="sm")
    with streamlb.run(src, client=two_workers, key_groups=64, window="200ms", balancer="autoflow") as job:
        job.wait(timeout=120)
        history = job.history
        topology = job.topology()["operators"]
        agg, sm = job.state("agg"), job.state("sm")
        epochs = {op: job.routing(op).epoch for op in ("agg", "sm")}
    assert {e["operator"] for e in history} == {"agg", "sm"}, history     # each table balanced on its own
    for op in ("agg", "sm"):
        assert epochs[op] == max(e["epoch"] for e in history if e["operator"] == op)
    assert topology["agg"]["routers"] == topology["sm"]["routers"]       # one upstream stage, two tables
    assert topology["agg"]["stage"] != topology["sm"]["stage"]
    pd.testing.assert_frame_equal(agg.sort_index(), zipf_frame.groupby("key").agg(**AGG), check_dtype=False)
    counts = zipf_frame.groupby("key").size()
    assert sm.index.sort_values().tolist() == counts.index.tolist()
    assert sm["state"].sort_index().tolist() == counts.tolist()
