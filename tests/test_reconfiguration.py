"""Live reconfiguration on real worker processes: rescale, move_instance, retiring workers,
update and autoscaling, each checked exactly against pandas over the same input."""
from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from streamz import Stream

import streamlb
from streamlb import MigrationError, ReconfigurationError

from test_pipeline import in_applied_order, running_count

G = 64
STRATEGIES = ["all-at-once", "fluid", "lazy", "pause"]
AGG = {"count": ("value", "count"), "sum": ("value", "sum"), "max": ("value", "max")}


WEIGHTS = {"v1": 1, "v2": 10, "v3": 100}


def versioned(tag, weight):
    """A stateful map whose state grows by ``weight`` per record and whose output says
    which version made it: ``(tag, state, value)``."""
    def step(state, rec):
        n = (state or 0) + weight
        return n, (tag, n, rec["value"])
    return step


def pipeline(path, rate):
    src = Stream.from_parquet(path, batch_size=10_000, rate=rate)
    totals = src.key_by("key").aggregate(AGG, parallelism=2, name="totals").sink_to_list()
    outs = src.key_by("key").stateful_map(versioned("v1", 1), parallelism=2, name="running").sink_to_list()
    return src, outs, totals


def check_versions(outputs: pd.DataFrame, state: pd.DataFrame, frame: pd.DataFrame) -> None:
    """Per key, in the order the records were applied (the state only grows): versions
    never go back, each step adds the weight of the version that made it (a sequential
    replay), the values come in event-time order and the state is the last output.
    Checked over whole arrays (a loop over the ~19k keys took 24 s)."""
    truth, key, (tag, n, value) = in_applied_order(outputs, frame, by=1)
    w = pd.Series(tag).map(WEIGHTS).to_numpy()
    first = np.r_[True, key[1:] != key[:-1]]     # a key's first output
    bad = ~first & (np.diff(w, prepend=0) < 0)
    assert not bad.any(), key[bad][0]                                  # v1... then v2... then v3...
    step = np.where(first, n, np.diff(n, prepend=0))
    bad = step != w
    assert not bad.any(), key[bad][0]                                  # replayed one by one
    assert len(key) == len(truth), (len(key), len(truth))
    bad = (key != truth["key"].to_numpy()) | (value != truth["value"].to_numpy())
    assert not bad.any(), key[bad][0]
    last = np.r_[first[1:], True]                                      # a key's last output
    assert state["state"].sort_index().tolist() == n[last].tolist()


def ended(exc: Exception) -> bool:
    """A refusal because the stream ended first (nothing changed)."""
    return any(s in str(exc) for s in ("input ended", "cannot take part", "needs a running job", "finishing"))


actions = st.lists(
    st.tuples(
        st.floats(0.0, 0.3),                                           # pause before it
        st.sampled_from(["totals", "running"]),
        st.one_of(
            st.tuples(st.just("rescale"), st.integers(1, 5)),
            st.tuples(st.just("move"), st.integers(0, 4)),
            st.tuples(st.just("migrate"), st.sets(st.integers(0, G - 1), min_size=1, max_size=16)),
            st.tuples(st.just("update"), st.sampled_from(["v2", "v3"])),
        ),
    ),
    min_size=2, max_size=5,
)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])     # a shrink would rerun a cluster job per step
@given(actions=actions)
def test_random_reconfigurations_with_a_balancer_lose_nothing(two_workers, zipf_path, zipf_frame, strategy,
                                                              actions):
    """Rescales, moves, manual migrations and updates at random moments, while the
    ``greedy`` balancer moves key groups too (one example per strategy; more in the slow
    test below)."""
    random_reconfigurations(two_workers, zipf_path, zipf_frame, strategy, actions)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(actions=actions)
def test_random_reconfigurations_many_examples(two_workers, zipf_path, zipf_frame, strategy, actions):
    random_reconfigurations(two_workers, zipf_path, zipf_frame, strategy, actions)


def random_reconfigurations(two_workers, zipf_path, zipf_frame, strategy, actions):
    src, outs, totals = pipeline(zipf_path, rate=150_000)         # about 2 s of stream
    workers = sorted(two_workers.scheduler_info()["workers"])
    version = 1
    with streamlb.run(src, client=two_workers, key_groups=G, migration=strategy, balancer="greedy",
                      window="100ms") as job:
        for delay, op, (kind, arg) in actions:
            time.sleep(delay)
            n = job.parallelism(op)
            try:
                if kind == "rescale":
                    assert job.rescale(op, arg, strategy=strategy) == arg == job.parallelism(op)
                    assert set(job.routing(op).owners.tolist()) <= set(range(arg))
                    assert len(job.state_size(op)) == arg
                elif kind == "move":
                    i = arg % n
                    here = job.workers_of[(job.plan.stage(op).id, i)]
                    to = next(w for w in workers if w != here)
                    job.move_instance(op, i, to)
                    assert job.workers_of[(job.plan.stage(op).id, i)] == to
                elif kind == "migrate":
                    job.migrate(op, arg, n - 1, strategy=strategy)
                elif int(arg[1]) > version:                 # versions only go forward
                    job.update("running", versioned(arg, WEIGHTS[arg]))
                    version = int(arg[1])
            except (ReconfigurationError, MigrationError) as exc:
                assert ended(exc), exc
                break
        job.wait(timeout=120)
        truth = zipf_frame.groupby("key").agg(**AGG)
        pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)
        check_versions(pd.concat(outs), job.state("running"), zipf_frame)


@pytest.fixture()
def one_file(tmp_path):
    """One Parquet file (so the job has one source instance), made by pandas."""
    rng = np.random.default_rng(5)
    n = 120_000
    df = pd.DataFrame({"key": (rng.zipf(1.3, n) % 3000).astype(np.int64), "value": rng.random(n),
                       "rid": np.arange(n, dtype=np.int64)})
    path = str(tmp_path / "one.parquet")
    df.to_parquet(path)
    return path, df


def test_a_new_worker_takes_instances_and_a_retired_one_gives_them_back(one_file):
    """cluster.scale(3), rescale onto the new worker, then client.retire_workers the
    original worker holding the source while the job runs: its instances (the source
    too) move first, the job ends exact on the remaining workers."""
    from distributed import Client, LocalCluster

    path, df = one_file
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as c:
        src = Stream.from_parquet(path, batch_size=4000, rate=15_000)        # about 8 s
        src.key_by("key").aggregate(AGG, parallelism=2, name="totals")
        with streamlb.run(src, client=c, key_groups=G) as job:
            old = sorted(job.workers)
            cl.scale(3)
            c.wait_for_workers(3)
            (new,) = [w for w in c.scheduler_info()["workers"] if w not in old]
            assert job.rescale("totals", 4, workers=[new]) == 4
            sid = job.plan.stage("totals").id
            assert [job.workers_of[(sid, i)] for i in (2, 3)] == [new, new]
            (victim,) = {w for (s, _), w in job.workers_of.items() if job.plan.stages[s].is_source}
            on_victim = [k for k, w in job.workers_of.items() if w == victim]
            assert len(on_victim) >= 2, "the worker to retire holds the source and an aggregate instance"
            read = job.offsets()
            retired = c.retire_workers([victim])
            assert victim in retired and victim not in c.scheduler_info()["workers"]
            assert victim not in job.workers_of.values()
            assert [h["kind"] for h in job.history if h.get("kind") == "move"] == ["move"] * len(on_victim)
            assert job.status == "running" and read
            # the last workers cannot all go: refused, naming the job and the operators
            with pytest.raises(Exception, match=rf"job {job.id} \(operators .*totals.*\) and no worker"):
                c.retire_workers(sorted(c.scheduler_info()["workers"]))
            assert len(c.scheduler_info()["workers"]) == 2
            job.wait(timeout=120)
            assert job.summary()["records"] == len(df)
            truth = df.groupby("key").agg(**AGG)
            pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)


@pytest.mark.parametrize("kind", ["paced", "replayed", "items"])
def test_a_source_moves_mid_stream_and_goes_on_where_it_stopped(two_workers, one_file, kind):
    """The new source emits exactly the rows the old one had not: nothing twice, nothing lost."""
    path, df = one_file
    if kind == "items":
        src = Stream.from_iterable([df.iloc[i:i + 3000] for i in range(0, len(df), 3000)])
    else:
        src = Stream.from_parquet(path, batch_size=3000, rate=40_000,
                                  event_time="rid" if kind == "replayed" else None)
    rows = src.map(lambda b: b[["rid"]]).sink_to_list()
    src.key_by("key").aggregate(AGG, parallelism=2, name="totals")
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        name = job.plan.stages[0].name
        for _ in range(2):
            here = job.workers_of[(0, 0)]
            job.move_instance(name, 0, next(w for w in job.workers if w != here))
            time.sleep(0.4)
        job.wait(timeout=120)
        assert job.summary()["records"] == len(df)
        pd.testing.assert_frame_equal(job.state("totals"), df.groupby("key").agg(**AGG), check_dtype=False)
    got = pd.concat(rows).rid.to_numpy()
    np.testing.assert_array_equal(np.sort(got), df.rid.to_numpy())


def by_rid(tag, weight):
    def step(state, rec):
        n = (state or 0) + weight
        return n, (tag, n, rec["rid"])
    return step


def tag_with(tag):
    def f(df):
        return df.assign(tag=tag)
    return f


@pytest.mark.parametrize("parallelism", [1, 3])
def test_update_switches_functions_at_one_epoch_and_keeps_state(two_workers, one_file, parallelism):
    """Records before the switch see the old function, later ones the new, for the
    stateful_map and for a named map fused into the source; the state is a sequential
    replay of both functions over the records in their order."""
    path, df = one_file
    src = Stream.from_parquet(path, batch_size=2000, rate=40_000)             # about 3 s
    tagged = src.map(tag_with("a"), stream_name="tag")
    tags = tagged.sink_to_list()
    outs = tagged.key_by("key").stateful_map(by_rid("v1", 1), parallelism=parallelism,
                                             name="counts").sink_to_list()
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        time.sleep(1.0)
        job.update("counts", by_rid("v2", 10))
        job.update("tag", tag_with("b"))
        assert [h["kind"] for h in job.history] == ["update", "update"]
        job.wait(timeout=120)
        state = job.state("counts")
    out = pd.DataFrame([o for frame in outs for o in frame["output"]], columns=["tag", "n", "rid"])
    # one cut in the source's order: every v1 record comes before every v2 record
    v1, v2 = out[out.tag == "v1"], out[out.tag == "v2"]
    assert len(v1) and len(v2) and len(out) == len(df)
    assert v1.rid.max() < v2.rid.min()
    cut = v2.rid.min()
    # the state: a sequential replay with weight 1 before the cut and 10 from it
    weight = np.where(df.rid < cut, 1, 10)
    want = pd.Series(weight, index=df.key).groupby(level=0).sum().sort_index()
    assert state["state"].tolist() == want.tolist()
    # the map's tags switch once too, between two batches of the source
    t = pd.concat(tags)
    assert (t.tag.to_numpy()[:-1] <= t.tag.to_numpy()[1:]).all() and set(t.tag) == {"a", "b"}


def test_bad_reconfigurations_are_refused_and_the_job_runs_on(two_workers, one_file):
    path, df = one_file
    src = Stream.from_parquet(path, batch_size=4000, rate=30_000)
    src.key_by("key").aggregate(AGG, parallelism=2, name="totals")
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        with pytest.raises(ReconfigurationError, match="no operator named 'nope'"):
            job.rescale("nope", 2)
        for bad in (0, G + 1, "3", 2.5):
            with pytest.raises(ReconfigurationError, match=rf"'totals'.*1\.\.{G}"):
                job.rescale("totals", bad)
        with pytest.raises(ReconfigurationError, match="is a source"):
            job.rescale(job.plan.stages[0].name, 2)
        with pytest.raises(ReconfigurationError, match="no worker 'tcp://1.2.3.4:5'"):
            job.rescale("totals", 3, workers=["tcp://1.2.3.4:5"])
        with pytest.raises(ReconfigurationError, match=r"instances 0\.\.1; cannot move instance 7"):
            job.move_instance("totals", 7, job.workers[0])
        with pytest.raises(ReconfigurationError, match="no worker"):
            job.move_instance("totals", 0, "tcp://nowhere:1")
        with pytest.raises(ReconfigurationError, match="no function named 'totals'"):
            job.update("totals", lambda s, r: (s, r))
        st_ = job.plan.stage("totals")
        with job.reconfig._reserved(st_, "a test"):       # another reconfiguration is running
            with pytest.raises(ReconfigurationError, match="already being reconfigured"):
                job.rescale("totals", 3)
        assert job.parallelism("totals") == 2
        job.wait(timeout=120)
        pd.testing.assert_frame_equal(job.state("totals"), df.groupby("key").agg(**AGG), check_dtype=False)


def test_update_refuses_unpicklable_and_wrong_arity_functions(two_workers, one_file):
    path, df = one_file
    src = Stream.from_parquet(path, batch_size=4000, rate=30_000)
    src.key_by("key").stateful_map(running_count, parallelism=2, name="counts")
    lock = threading.Lock()
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        with pytest.raises(ReconfigurationError, match=r"cannot be called as f\(state, record\)"):
            job.update("counts", lambda state: state)
        with pytest.raises(ReconfigurationError, match="cannot be pickled"):
            job.update("counts", lambda s, r, _l=lock: (s, r))
        job.wait(timeout=120)
        assert job.state("counts")["state"].sort_index().tolist() == df.groupby("key").size().tolist()


def test_ds2_scales_out_on_a_step_in_the_rate_and_back_in_after(two_workers, tmp_path):
    """Event-time replay makes the offered rate step 3,300 -> 15,000 -> 2,500 rec/s; each
    instance manages 2,000 rec/s (emulated cost)."""
    rng = np.random.default_rng(2)
    t = np.concatenate([np.linspace(0, 6, 20_000, endpoint=False), np.linspace(6, 8, 30_000, endpoint=False),
                        np.linspace(8, 12, 10_000)])
    df = pd.DataFrame({"key": rng.integers(0, 5000, len(t)), "value": rng.random(len(t)), "t": t})
    df.to_parquet(tmp_path / "step.parquet")
    src = Stream.from_parquet(str(tmp_path / "step.parquet"), batch_size=1000, rate=5000, event_time="t")
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=2, name="totals", cost=1 / 2000)
    with streamlb.run(src, client=two_workers, key_groups=G, autoscale={"totals": (1, 12)},
                      scaler_options={"cooldown": 1}) as job:
        job.wait(timeout=120)
        state = job.balancer_state()
        decisions = [h for h in job.history if h.get("kind") == "autoscale"]
        counts = job.state("totals")
    done = [(d["from"], d["to"]) for d in decisions if d["status"] == "done"]
    assert done, decisions
    # out to keep up with 15,000 rec/s (ceil(15000 / (2000 * 0.7)) = 11) within 2 decisions of the step
    top = max(to for _, to in done)
    assert top >= 11, done
    assert [to for _, to in done].index(top) <= 2, done
    assert done[-1][1] < top, done                 # and back in once the rate dropped
    assert state["autoscale"]["decisions"][-1]["operator"] == "totals"
    assert counts["n"].sort_index().tolist() == df.groupby("key").size().tolist()


def test_a_rescale_that_fails_is_recorded_under_its_operator_and_the_job_runs_on(two_workers, tmp_path):
    """The autoscaler's rescale raises (here injected into the job's ``rescale``): the
    decision is recorded as failed with the operator's name and the error, the job ends
    exact."""
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"key": rng.integers(0, 500, 16_000), "value": rng.random(16_000)})
    df.to_parquet(tmp_path / "busy.parquet")
    src = Stream.from_parquet(str(tmp_path / "busy.parquet"), batch_size=1000, rate=10_000)
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=1, name="totals", cost=1 / 2000)
    with streamlb.run(src, client=two_workers, key_groups=G, autoscale={"totals": (1, 8)},
                      scaler_options={"cooldown": 1}) as job:
        def refused(operator, parallelism, strategy=None):
            raise RuntimeError(f"no room for {parallelism} instances of {operator}")

        job.rescale = refused
        job.wait(timeout=120)
        decisions = [h for h in job.history if h.get("kind") == "autoscale"]
        counts = job.state("totals")
    failed = [d for d in decisions if d["status"] == "failed"]
    assert failed and all(d["operator"] == "totals" for d in decisions), decisions
    assert failed[0]["reason"].startswith("RuntimeError: no room for") and failed[0]["from"] == 1, failed
    assert counts["n"].sort_index().tolist() == df.groupby("key").size().tolist()


def times(k):
    def f(b):
        return b.assign(double=b.value * k)
    return f


def test_a_stage_behind_rebalance_rescales_and_moves(two_workers, one_file, tmp_path):
    """Stateless instances come and go: every row is written once, to the list and to Parquet."""
    path, df = one_file
    out = str(tmp_path / "out")
    src = Stream.from_parquet(path, batch_size=3000, rate=30_000)                 # about 4 s
    mapped = src.rebalance(parallelism=3).map(times(2), stream_name="double")
    rows = mapped.sink_to_list()
    mapped.to_parquet(out)
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        time.sleep(0.5)
        assert job.rescale("rebalance", 5) == 5
        time.sleep(0.3)
        here = job.workers_of[(job.plan.stage("rebalance").id, 4)]
        job.move_instance("rebalance", 4, next(w for w in job.workers if w != here))
        time.sleep(0.3)
        assert job.rescale("rebalance", 2) == 2
        job.update("double", times(3))        # markers through the shuffle, one cut
        job.wait(timeout=120)
    got = pd.concat(rows).sort_values("rid").reset_index(drop=True)
    np.testing.assert_array_equal(got.rid.to_numpy(), df.rid.to_numpy())
    factor = got.double.to_numpy() / df.value.to_numpy()
    assert set(np.round(factor, 6)) <= {2.0, 3.0}
    cut = np.flatnonzero(np.round(factor) == 3)
    assert len(cut) and (np.round(factor[cut[0]:]) == 3).all()      # 2 before the cut, 3 from it
    written = pd.read_parquet(out).sort_values("rid").reset_index(drop=True)
    np.testing.assert_array_equal(written.rid.to_numpy(), df.rid.to_numpy())


def test_two_jobs_of_one_client_both_drain_a_retiring_worker(one_file):
    from distributed import Client, LocalCluster

    path, df = one_file
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as c:
        jobs = []
        for name in ("a", "b"):
            src = Stream.from_parquet(path, batch_size=4000, rate=30_000)
            src.key_by("key").aggregate(AGG, parallelism=3, name=name)
            jobs.append(streamlb.run(src, client=c, key_groups=G))
        try:
            victim = sorted(c.scheduler_info()["workers"])[0]
            assert all(victim in j.workers_of.values() for j in jobs)
            assert victim in c.retire_workers([victim])
            for j, name in zip(jobs, "ab"):
                assert victim not in j.workers_of.values()
                j.wait(timeout=120)
                pd.testing.assert_frame_equal(j.state(name), df.groupby("key").agg(**AGG), check_dtype=False)
        finally:
            for j in jobs:
                j.stop()
