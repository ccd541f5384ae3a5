"""Live migration of key groups under every strategy, on 2 worker processes."""
import logging
import time

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamz import Stream

import streamlb
from streamlb import MigrationError
from test_pipeline import check_emitted, check_running_count, running_count

pytestmark = pytest.mark.spark

G = 64
STRATEGIES = ["all-at-once", "fluid", "lazy", "pause", "batched"]
AGG = {"count": ("value", "count"), "sum": ("value", "sum"), "max": ("value", "max")}


def pipeline(path, rate, watch=None):
    src = Stream.from_parquet(path, batch_size=10_000, rate=rate, watch=watch)
    totals = src.key_by("key").aggregate(AGG, parallelism=3, name="totals").sink_to_list()
    outs = src.key_by("key").stateful_map(running_count, parallelism=3, name="running").sink_to_list()
    return src, outs, totals


moves = st.lists(
    st.tuples(
        st.floats(0.0, 0.25),                                   # pause before the move
        st.sampled_from(["totals", "running"]),
        st.sets(st.integers(0, G - 1), min_size=1, max_size=24),
        st.integers(0, 2),                                      # new owner
    ),
    min_size=1, max_size=4,
)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=moves, asked=st.sampled_from([50, 1 << 17]), fluid_keys=st.sampled_from([0, 1 << 16]))
def test_random_moves_lose_nothing_and_keep_per_key_order(two_workers, zipf_path, zipf_frame, strategy, moves, asked,
                                                          fluid_keys):
    """``asked``: with lazy, a router that remembers only 50 keys it asked for asks again
    for keys already pulled (nothing comes back for them). ``fluid_keys``: 0 makes every
    fluid epoch exactly ``fluid-step`` groups (several epochs per move); this small state
    otherwise moves in one."""
    import dask

    src, outs, totals = pipeline(zipf_path, rate=250_000)    # about 1.2 s of stream
    with dask.config.set({"streamlb.migration.lazy-asked-keys": asked,
                          "streamlb.migration.fluid-keys": fluid_keys}), \
            streamlb.run(src, client=two_workers, key_groups=G) as job:
        for delay, op, groups, to in moves:
            time.sleep(delay)
            try:
                job.migrate(op, groups, to, strategy=strategy)
            except MigrationError as exc:   # the stream ended first: a refusal, nothing moved
                assert "it cannot take part" in str(exc)
                break
            table = job.routing(op)
            assert (table.owners[sorted(groups)] == to).all()
        job.wait(timeout=120)
        truth = zipf_frame.groupby("key").agg(**AGG)
        pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)
        check_emitted(totals, truth)        # never a partial value, even with lazy pulls
        check_running_count(pd.concat(outs), job.state("running"), zipf_frame)
        for op in ("totals", "running"):    # every key ended on the owner of its group
            held = job.state(op).index.to_numpy()
            assert len(held) == zipf_frame.key.nunique()


@pytest.fixture(scope="module")
def wide_path(tmp_path_factory):
    """1.5M rows over 1.2M keys (a large state), written as 4 Parquet files."""
    rng = np.random.default_rng(5)
    n = 1_500_000
    df = pd.DataFrame({"key": rng.permutation(np.arange(n, dtype=np.int64))[:n] % 1_200_000,
                       "value": rng.integers(0, 100, n).astype(float)})
    path = tmp_path_factory.mktemp("wide")
    for p in range(4):
        df.iloc[p::4].to_parquet(path / f"part-{p}.parquet", index=False)
    return str(path), df


MERGE_AGG = {"count": ("value", "count"), "sum": ("value", "sum"), "lo": ("value", "min"),
             "hi": ("value", "max"), "mean": ("value", "mean")}


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=st.lists(st.tuples(st.floats(0.0, 0.2), st.sets(st.integers(0, G - 1), min_size=1, max_size=40),
                                st.integers(0, 2)), min_size=1, max_size=3))
def test_lazy_into_a_terminal_aggregate_merges_without_loss(two_workers, zipf_path, zipf_frame, moves):
    """An aggregate nothing reads per batch moves lazily by merging: the new owner applies
    the moved groups' rows at once and the old state is merged in as it drains. The final
    state equals pandas."""
    src = Stream.from_parquet(zipf_path, batch_size=10_000, rate=250_000)
    src.key_by("key").aggregate(MERGE_AGG, parallelism=3, name="totals")
    truth = zipf_frame.groupby("key").agg(**MERGE_AGG)
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        for delay, groups, to in moves:
            time.sleep(delay)
            try:
                job.migrate("totals", groups, to, strategy="lazy")
            except MigrationError as exc:   # the stream ended first: a refusal, nothing moved
                assert "it cannot take part" in str(exc)
                break
            assert (job.routing("totals").owners[sorted(groups)] == to).all()
        job.wait(timeout=120)
        assert [e["strategy"] for e in job.history] == ["lazy"] * len(job.history)
        assert all(e["first_moved_record_applied"] is None or e["first_moved_record_applied"] < e["installed"]
                   for e in job.history)
        pd.testing.assert_frame_equal(job.state("totals").sort_index(), truth, check_dtype=False)


def test_state_read_during_a_merging_lazy_move_counts_each_record_once(two_workers, wide_path):
    """While a large state merges over (the moved groups' rows applied at the new owner
    before their old state has drained), every read of the state has each key once, and
    no key's count goes down from one read to the next."""
    import threading

    path, df = wide_path
    src = Stream.from_parquet(path, batch_size=20_000, rate=600_000)
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=3, name="n")
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        time.sleep(0.9)
        moving = job.routing("n").key_groups_of(0)
        before = job.state("n")["n"]
        errors: list = []

        def move():
            try:
                job.migrate("n", moving, 1, strategy="lazy")
            except Exception as exc:        # shown below, not lost in the thread
                errors.append(exc)

        mover = threading.Thread(target=move)
        mover.start()
        reads = []
        while mover.is_alive() or not reads:
            reads.append(job.state("n")["n"])
        mover.join()
        assert not errors, errors
        job.wait(timeout=120)
        final = job.state("n")["n"]
        e = job.history[-1]
    assert e["first_moved_record_applied"] < e["installed"]      # rows went in before the state
    for earlier, later in zip([before, *reads], [*reads, final]):
        assert not later.index.duplicated().any()
        assert (later.reindex(earlier.index, fill_value=0) >= earlier).all()
    assert final.sum() == len(df) and len(final) == df.key.nunique()


def test_a_move_asked_during_a_state_read_waits_for_every_instance_to_answer(two_workers, zipf_path, zipf_frame):
    """``job.state()`` asks every instance at once and they answer at different times. The
    new owner's answer is held back here (a real instance, its read delayed on its worker)
    while the old owner has answered: a move that went on meanwhile would leave the moved
    groups in both answers. The move waits for the read, then runs."""
    import threading

    def slow_reads(dask_worker, delay=2.0):
        import asyncio

        for inst in list(dask_worker.state.actors.values()):
            if getattr(getattr(inst, "stage", None), "name", None) == "n" and inst.index == 1:
                read = inst.state

                async def slow(groups=None, nbytes=None):
                    await asyncio.sleep(delay)
                    return await read(groups, nbytes)

                inst.state = slow
                return True
        return False

    src = Stream.from_parquet(zipf_path, batch_size=5_000, rate=60_000)    # about 5 s of stream
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=2, name="n")
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        assert sum(two_workers.run(slow_reads).values()) == 1
        time.sleep(0.5)                 # both instances hold keys
        read: list = []
        reader = threading.Thread(target=lambda: read.append(job.state("n")["n"]))
        reader.start()
        time.sleep(0.4)                 # the old owner has answered; the new one is waiting
        moving = job.routing("n").key_groups_of(0)
        asked = time.time()
        job.migrate("n", moving, 1, strategy="all-at-once")
        reader.join()
        job.wait(timeout=120)
        final = job.state("n")["n"]
        e = job.history[-1]
    assert e["started"] - asked > 1.0           # it started once the read had its answers
    assert not read[0].index.duplicated().any()
    assert read[0].sum() <= len(zipf_frame) and (final.reindex(read[0].index) >= read[0]).all()
    truth = zipf_frame.groupby("key").size()
    pd.testing.assert_series_equal(final.sort_index(), truth.rename("n").astype(final.dtype), check_names=False)


@pytest.mark.parametrize("strategy", ["all-at-once", "lazy"])
def test_unmoved_groups_keep_flowing_during_a_migration(two_workers, wide_path, strategy):
    path, df = wide_path
    # 2.5 s: still running at 0.9 s; a batch every ~17 ms per source, so even an all-at-once
    # move over within 25 ms (seen in a fresh-clone run) spans batches for every instance
    src = Stream.from_parquet(path, batch_size=5_000, rate=600_000)
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=3, name="n")
    with streamlb.run(src, client=two_workers, key_groups=G, window="50ms") as job:
        time.sleep(0.9)
        moving = job.routing("n").key_groups_of(0)
        job.migrate("n", moving, 1, strategy=strategy)
        job.wait(timeout=120)
        rec = job.history[-1]
        m = job.metrics()
        state = job.state("n")
    assert state["n"].sum() == len(df) and len(state) == df.key.nunique()
    if strategy == "lazy":
        # the new owner applied records (of its own groups, and of moved keys already
        # pulled) while the rest of the moved state was still on its way; an all-at-once
        # move of this size may be installed before the next batch arrives
        assert rec["applied_while_waiting"] > 0
    # and the instance not involved kept applying records throughout the migration window
    bystander = m[(m.operator == "n") & (m.instance == 2)]
    start = pd.Timestamp(rec["started"], unit="s").floor("50ms")
    during = bystander[(bystander.window_start >= start)
                       & (bystander.window_start <= pd.Timestamp(rec["completed"], unit="s"))]
    assert during.records.sum() > 0, (rec, bystander)


def test_bad_moves_are_refused_and_the_job_keeps_its_routing(two_workers, zipf_path, zipf_frame):
    src, outs, _ = pipeline(zipf_path, rate=600_000)
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        before = job.routing("totals")
        with pytest.raises(MigrationError, match=r"'totals' has instances 0..2; cannot move key groups to instance 7"):
            job.migrate("totals", [1, 2], 7)
        with pytest.raises(MigrationError, match=r"'totals': key group 64 is outside 0..63"):
            job.migrate("totals", [3, 64], 1)
        with pytest.raises(ValueError, match="unknown migration strategy 'teleport'; valid strategies are "
                                             "all-at-once, fluid, lazy, pause"):
            job.migrate("totals", [3], 1, strategy="teleport")
        with pytest.raises(KeyError, match="no operator named 'nope'"):
            job.migrate("nope", [3], 1)
        after = job.routing("totals")
        assert after.epoch == before.epoch and (after.owners == before.owners).all()
        job.wait(timeout=120)
        pd.testing.assert_frame_equal(job.state("totals"), zipf_frame.groupby("key").agg(**AGG), check_dtype=False)
        with pytest.raises(MigrationError, match="is done; migrations need a running job"):
            job.migrate("totals", [3], 1)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_owner_gives_and_takes_in_one_epoch(two_workers, zipf_path, zipf_frame, strategy, caplog):
    caplog.set_level(logging.INFO, logger="streamlb")
    src, outs, _ = pipeline(zipf_path, rate=200_000)        # 1.5 s of stream
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        time.sleep(0.2)
        owners = job.routing("totals").owners
        a = int(np.flatnonzero(owners == 0)[0])
        b = int(np.flatnonzero(owners == 1)[0])
        c = int(np.flatnonzero(owners == 2)[0])
        table = job.reassign("totals", {a: 1, b: 2, c: 0}, strategy=strategy)   # a cycle
        assert table.epoch == 1          # three groups fit in one epoch, fluid included
        assert (table.owners[[a, b, c]] == [1, 2, 0]).all()
        job.wait(timeout=120)
        pd.testing.assert_frame_equal(job.state("totals"), zipf_frame.groupby("key").agg(**AGG), check_dtype=False)
        check_running_count(pd.concat(outs), job.state("running"), zipf_frame)
    # the job's life at INFO on named loggers (the epoch's from the plugin, in this process's scheduler)
    said = [(r.name, r.getMessage()) for r in caplog.records if r.levelno == logging.INFO]
    assert ("streamlb.job", f"job {job.id} finished") in said
    assert any(n == "streamlb.job" and m.startswith(f"job {job.id} started: ") for n, m in said)
    assert any(n == "streamlb.migration" and m.startswith(f"job {job.id}: epoch 1 of 'totals' ({strategy}) moved 3 "
                                                          "key groups from [0, 1, 2] to [0, 1, 2]") for n, m in said)


def test_groups_of_a_timed_out_epoch_move_again_only_once_it_settles(two_workers, wide_path):
    """An epoch that times out after the routers switched keeps its state moving; moving its
    groups again before it lands is refused naming them, and allowed once it has landed.
    Nothing is lost either way."""
    import dask

    path, df = wide_path
    src = Stream.from_parquet(path, batch_size=20_000, rate=400_000)     # 3.75 s; a large state at 0.5 s
    # each owner serves about as fast as records arrive, so a marker queues behind a few
    # batches and the epoch is still under way when the move is asked again
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=3, name="n", cost=8e-6)
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        time.sleep(0.5)
        moving = job.routing("n").key_groups_of(0)
        with dask.config.set({"streamlb.migration.timeout": "1ms"}):
            with pytest.raises(MigrationError, match="timed out after 0.001s waiting for epoch 1 of n"):
                job.migrate("n", moving, 1, strategy="all-at-once")
        assert job.routing("n").epoch == 1                  # the routers did switch
        with pytest.raises(MigrationError, match=rf"key group {moving[0]} is still moving \(epoch 1 timed out"):
            job.migrate("n", moving, 2)
        deadline = time.monotonic() + 2.5                   # the source still runs by then
        while True:                                         # refused until the state lands
            try:
                job.migrate("n", moving, 2, strategy="all-at-once")
                break
            except MigrationError as exc:
                if "still moving" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        job.wait(timeout=120)
        state = job.state("n")
        table = job.routing("n")
    assert state["n"].sum() == len(df) and len(state) == df.key.nunique()
    assert (table.owners[moving] == 2).all()


def test_fluid_epochs_take_moves_in_turn_by_pair():
    """A swap between two instances moves groups both ways in every fluid epoch, so each
    instance frees about what it installs."""
    from streamlb._migration._epochs import _interleave

    owners = np.array([0] * 8 + [1] * 8)
    moving = [(g, 1) for g in range(0, 8, 2)] + [(g, 0) for g in range(8, 16, 2)] + [(1, 2), (3, 2)]
    order = _interleave(moving, owners)
    assert sorted(order) == sorted(moving)
    assert [g for g, _ in order] == [0, 8, 1, 2, 10, 3, 4, 12, 6, 14]


def test_fluid_epochs_take_at_least_a_step_and_more_while_within_the_key_budget():
    """Small groups move together; large ones fluid-step at a time; nothing dropped or
    repeated, and the order kept."""
    from streamlb._migration._epochs import _fluid_epochs

    moving = [(g, g % 2) for g in range(10)]
    big = {g: 30_000 for g in range(10)}
    assert [len(e) for e in _fluid_epochs(moving, 4, big, 65_536)] == [4, 4, 2]
    small = {g: 100 for g in range(10)}
    assert _fluid_epochs(moving, 4, small, 65_536) == [moving]
    mixed = {**small, 4: 60_000, 5: 60_000}
    parts = _fluid_epochs(moving, 2, mixed, 65_536)
    assert [m for e in parts for m in e] == moving
    assert [len(e) for e in parts] == [5, 5]        # 0-4 fit the budget, 5 does not; then 5-9
    assert [len(e) for e in _fluid_epochs(moving, 4, small, 0)] == [4, 4, 2]
    assert _fluid_epochs([], 4, {}, 65_536) == []
    assert [len(e) for e in _fluid_epochs(moving, 4, {}, 0)] == [4, 4, 2]   # fluid-keys 0: nothing counted


def test_lazy_drain_chunks_take_at_least_a_step_and_more_while_within_lazy_keys():
    """The lazy drain's chunks over a real store: every group once, in order; groups of few
    keys drain together up to ``lazy-keys``, a large one alone (at least ``lazy-step``)."""
    from streamlb._worker._instance import OwnerSide          # the worker package first
    from streamlb._state import AggregateState
    from streamlb.keygroups import assign_to_key_group

    G = 64
    keys = np.arange(20_000)
    groups = assign_to_key_group(keys, G, name="k")
    big = int(groups[0])
    keys = np.concatenate([keys[groups != big][:600], keys[groups == big]])   # one large group
    store = AggregateState("n", {"n": ("v", "count")}, "k", G)
    store.update(pd.DataFrame({"k": keys, "v": 1.0}))
    per = dict(zip(range(G), store.keys_per_group(range(G)).tolist()))
    assert per[big] > 250 and sum(per.values()) == len(keys)

    def chunks(step, budget):
        owner = OwnerSide(store, None, index=0, merges=False, send=None, apply=None, spawn=None,
                          lazy_step=step, lazy_delay=0, lazy_pace=0, lazy_keys=budget)
        return owner._lazy_chunks(list(range(G)))

    for step, budget in [(1, 0), (1, 100), (4, 100), (1, 250), (3, 4096)]:
        got = chunks(step, budget)
        assert [g for c in got for g in c] == list(range(G))
        for c in got:
            assert len(c) >= step or c is got[-1]
            assert len(c) <= step or sum(per[g] for g in c) <= budget
            if c is not got[-1]:          # it stopped only where the next group broke the budget
                nxt = got[got.index(c) + 1][0]
                assert len(c) < step or sum(per[g] for g in c) + per[nxt] > budget
    assert chunks(1, 0) == [[g] for g in range(G)]                # lazy-keys 0: lazy-step alone
    assert chunks(2, 0) == [[g, g + 1] for g in range(0, G, 2)]
    assert chunks(1, 4096) == [list(range(G))]                    # all of it within the budget
    assert [big] in chunks(1, 250)                                # the large group alone


def _count_hashed_rows(reset: bool):
    """On a worker: count the keys ``stable_hash`` sees (installed once per process)."""
    from streamlb import keygroups

    if not hasattr(keygroups, "_rows_hashed"):
        plain = keygroups.stable_hash
        keygroups._rows_hashed = [0]

        def counting(keys, *, name="key"):
            keygroups._rows_hashed[0] += len(keys)
            return plain(keys, name=name)

        keygroups.stable_hash = counting
    if reset:
        keygroups._rows_hashed[0] = 0
    return keygroups._rows_hashed[0]


def test_a_records_key_group_is_computed_once_per_exchange(two_workers, zipf_path, zipf_frame):
    """Routers hash each record's key once; the key group travels with the batch, so the
    owners (holding rows back, installing, pulling keys lazily, merging) never hash it
    again, however many epochs move state meanwhile."""
    two_workers.run(_count_hashed_rows, True)
    # two keyed exchanges; 3 s of stream, watched so that the job runs on until it is drained
    # (on a loaded machine the five moves outlasted the stream: an instance done before an epoch)
    src, outs, totals = pipeline(zipf_path, rate=100_000, watch="1s")
    # rows, not batches summed per key (which hash each distinct key once): every record
    # is counted
    with dask.config.set({"streamlb.exchange.combine": False}), \
            streamlb.run(src, client=two_workers, key_groups=G) as job:
        for strategy, op, groups, to in [("all-at-once", "totals", range(0, 12), 1),
                                         ("lazy", "running", range(4, 30), 2),
                                         ("fluid", "totals", range(20, 40), 0), ("lazy", "totals", range(40, 60), 2),
                                         ("all-at-once", "running", range(30, 50), 0)]:
            time.sleep(0.1)
            job.migrate(op, list(groups), to, strategy=strategy)
        deadline = time.time() + 120
        while job.state("totals")["count"].sum() < len(zipf_frame) and time.time() < deadline:
            time.sleep(0.5)
        job.drain(timeout=120)
        truth = zipf_frame.groupby("key").agg(**AGG)
        pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)
    assert len(job.history) >= 5
    hashed = sum(two_workers.run(_count_hashed_rows, False).values())
    assert hashed == 2 * len(zipf_frame)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_in_rocksdb_is_exact_under_each_strategy_and_a_rescale(two_workers, zipf_path, zipf_frame, strategy,
                                                                     tmp_path):
    """``state_backend="rocksdb"``: autoflow balances with each strategy, one move is asked
    for whatever it decides, and the operator rescales (3 -> 2 -> 3) while the stream runs."""
    import os

    # 5 s of stream: batched moves in rounds, and on a slow day its three reconfigurations
    # outlasted 3 s of it (an instance done before the last epoch)
    src = Stream.from_parquet(zipf_path, batch_size=10_000, rate=60_000)
    totals = src.key_by("key").aggregate(AGG, parallelism=3, name="totals").sink_to_list()
    with dask.config.set({"streamlb.state.dir": str(tmp_path)}), \
            streamlb.run(src, client=two_workers, key_groups=G, balancer="autoflow", migration=strategy, window=0.2,
                         state_backend="rocksdb") as job:
        time.sleep(0.3)
        job.migrate("totals", range(0, 12), 2, strategy=strategy)
        job.rescale("totals", 2, strategy=strategy)
        job.rescale("totals", 3, strategy=strategy)
        assert job.summary()["records"] < len(zipf_frame), "the stream ended before the rescales"
        job.wait(timeout=120)
        assert len(os.listdir(tmp_path)) >= 3      # a database per instance
        assert sum(job.state_size("totals").values()) == zipf_frame.key.nunique()
        truth = zipf_frame.groupby("key").agg(**AGG)
        pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)
        check_emitted(totals, truth)
        assert {h.get("kind", "migration") for h in job.history} >= {"migration", "rescale"}


def test_a_savepoint_restores_across_state_backends(two_workers, zipf_path, zipf_frame, tmp_path):
    """The snapshot files are the same for both backends: a savepoint taken with one restores
    into the other, at another parallelism, and the job ends exact."""
    truth = zipf_frame.groupby("key").agg(**AGG)
    for first, second in [("memory", "rocksdb"), ("rocksdb", "memory")]:
        src = Stream.from_parquet(zipf_path, batch_size=10_000, rate=150_000)
        src.key_by("key").aggregate(AGG, parallelism=2, name="totals")
        job = streamlb.run(src, client=two_workers, key_groups=G, state_backend=first)
        try:
            time.sleep(0.6)
            path = job.savepoint(str(tmp_path / f"sp-{first}"))
        finally:
            job.stop()
        src = Stream.from_parquet(zipf_path, batch_size=10_000)
        src.key_by("key").aggregate(AGG, parallelism=3, name="totals")
        with streamlb.run(src, client=two_workers, key_groups=G, state_backend=second, restore=path) as job:
            job.wait(timeout=120)
            assert 0 < job.summary()["records"] < len(zipf_frame)   # only what came after the savepoint
            pd.testing.assert_frame_equal(job.state("totals"), truth, check_dtype=False)
