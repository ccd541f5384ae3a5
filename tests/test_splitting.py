"""Hot-key splitting of aggregates, on 2 worker processes: exact state and emitted values."""
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamz import Stream

import streamlb
from streamlb import MigrationError
from streamlb.keygroups import assign_to_key_group
from test_pipeline import check_emitted, running_count

pytestmark = pytest.mark.spark

G, N = 64, 3
AGG = {"count": ("value", "count"), "sum": ("value", "sum"), "min": ("value", "min"), "max": ("value", "max")}


def check_exact(job, emitted, frame):
    """State, and the last value emitted per key, equal pandas over the same rows."""
    truth = frame.groupby("key").agg(**AGG)
    state = job.state("totals")
    off = state["count"].sub(truth["count"], fill_value=0)
    off = off[off != 0]
    assert off.empty, (f"counts off by {off.head(5).to_dict()} in key groups "
                       f"{sorted(set(assign_to_key_group(off.index.to_numpy(), G).tolist()))}; history "
                       f"{[(e['epoch'], e['strategy'], e['key_groups'], e.get('splits')) for e in job.history]}")
    pd.testing.assert_frame_equal(state, truth, check_dtype=False)
    check_emitted(emitted, truth)
    m = job.metrics()
    assert m[m.operator == "totals"]["records"].sum() == len(frame)  # each row applied exactly once


def hot_keys(frame, k=2):
    """The ``k`` hottest keys of each of the first two thirds of the stream (the data's hot
    keys drift every 100k of its 300k rows)."""
    rows = frame.sort_values("event_time", kind="stable")["key"]
    out = []
    for part in (rows.iloc[:100_000], rows.iloc[100_000:200_000]):
        out += [k for k in part.value_counts().index[:k].tolist() if k not in out]
    return out


def home(job, key):
    return int(job.routing("totals").owners[assign_to_key_group(np.array([key]), G)[0]])


actions = st.lists(
    st.tuples(
        st.floats(0.0, 0.3),                        # pause before the action
        st.integers(0, 3),                          # which hot key
        st.sets(st.integers(0, N - 1), max_size=N - 1),   # helpers (empty: merge back)
        st.booleans(),                              # also move a group that holds no split key
    ),
    min_size=1, max_size=5,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=actions)
def test_random_splits_and_merges_keep_state_and_emitted_values_exact(two_workers, zipf_path, zipf_frame,
                                                                      actions):
    keys = hot_keys(zipf_frame)
    src = Stream.from_parquet(zipf_path, batch_size=10_000, rate=250_000)   # about 1.2 s of stream
    emitted = src.key_by("key").aggregate(AGG, parallelism=N, name="totals").sink_to_list()
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        for delay, which, helpers, move in actions:
            time.sleep(delay)
            key = keys[which]
            helpers = sorted(helpers - {home(job, key)})
            try:
                table = job.split("totals", key, helpers)
                assert table.split_map().get(key, ()) == tuple(helpers)
                if move:
                    pinned = {assign_to_key_group(np.array([k]), G)[0] for k in table.split_map()}
                    free = next(g for g in range(G) if g not in pinned)
                    job.migrate("totals", [free], (table.owners[free] + 1) % N)
            except MigrationError as exc:       # the stream ended first: refused, nothing changed
                assert "cannot take part" in str(exc) or "is done" in str(exc), exc
                break
        job.wait(timeout=120)
        check_exact(job, emitted, zipf_frame)


def test_a_split_key_is_spread_over_its_helpers_and_merged_back(two_workers, zipf_path, zipf_frame):
    key = hot_keys(zipf_frame, 1)[0]            # hot in the first 0.5 s
    src = Stream.from_parquet(zipf_path, batch_size=5_000, rate=200_000)
    emitted = src.key_by("key").aggregate(AGG, parallelism=N, name="totals").sink_to_list()
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        h = home(job, key)
        helpers = [i for i in range(N) if i != h]
        job.split("totals", key, helpers)
        time.sleep(0.6)
        job.split("totals", key, [])
        assert job.routing("totals").splits == ()
        job.wait(timeout=120)
        m = job.metrics()
        split = m[m.operator == "totals"].groupby("instance")["split_records"].sum()
        assert split[helpers].gt(0).all() and split[h] == 0        # helpers aggregated, for the home
        assert split.sum() < (zipf_frame.key == key).sum()
        check_exact(job, emitted, zipf_frame)
        assert [e["strategy"] for e in job.history] == ["split", "split"]
        assert job.history[1]["from"] == helpers                   # they flushed to the home


def test_bad_splits_are_refused_and_the_job_keeps_running(two_workers, zipf_path, zipf_frame):
    src = Stream.from_parquet(zipf_path, batch_size=10_000, rate=300_000)
    emitted = src.key_by("key").aggregate(AGG, parallelism=N, name="totals").sink_to_list()
    src.key_by("key").stateful_map(running_count, parallelism=N, name="running")
    key = hot_keys(zipf_frame, 1)[0]
    with streamlb.run(src, client=two_workers, key_groups=G) as job:
        h = home(job, key)
        with pytest.raises(MigrationError, match="'running' is a stateful_map: its state is not combinable"):
            job.split("running", key, [(h + 1) % N])
        with pytest.raises(MigrationError, match=f"helpers are distinct instances in 0..2 other than the key's "
                                                 f"home {h}"):
            job.split("totals", key, [h])
        with pytest.raises(MigrationError, match="helpers are distinct instances in 0..2"):
            job.split("totals", key, [7])
        with pytest.raises(MigrationError, match=f"'totals' keys by integers; key '{key}' is a str"):
            job.split("totals", str(key), [(h + 1) % N])
        with pytest.raises(MigrationError, match=r"helpers must be a list of instance numbers in 0..2, got \[1.5\]"):
            job.split("totals", key, [1.5])
        job.split("totals", key, [(h + 1) % N])
        g = assign_to_key_group(np.array([key]), G)[0]
        with pytest.raises(MigrationError, match=f"key group {g} holds key {key}, split over instances"):
            job.migrate("totals", [g], (h + 2) % N)
        assert job.routing("totals").split_map() == {key: ((h + 1) % N,)}
        job.wait(timeout=120)
        check_exact(job, emitted, zipf_frame)
