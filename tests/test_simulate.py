"""The balancer simulator: traces, replays against numpy, a trace recorded from a real job."""
import os
import subprocess
import sys

import numpy as np
import pytest
from streamz import Stream

import streamlb
from streamlb.balancer import available_balancers
from streamlb.keygroups import assign_to_key_group
from streamlb.simulator import Trace, simulate, summarize, zipf_trace


@pytest.fixture(scope="module")
def cluster2():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as c:
        yield c


def test_zipf_trace_is_seeded_and_follows_the_key_distribution():
    a = zipf_trace(30, 64, 4, keys=2000, skew=1.1, records_per_window=50_000, drift_every=10, seed=3)
    b = zipf_trace(30, 64, 4, keys=2000, skew=1.1, records_per_window=50_000, drift_every=10, seed=3)
    np.testing.assert_array_equal(a.loads, b.loads)
    assert a.loads.shape == (30, 64) and (a.loads.sum(axis=1) == 50_000).all()
    # the first drift period: the hottest key (rank 1 is key 0) carries its Zipf share
    p = np.arange(1, 2001, dtype=float) ** -1.1
    p /= p.sum()
    want = np.bincount(assign_to_key_group(np.arange(2000), 64), weights=p, minlength=64)
    got = a.loads[:10].sum(axis=0) / a.loads[:10].sum()
    np.testing.assert_allclose(got, want, atol=0.004)
    # hot keys rotate: the second period's hottest group differs
    assert np.argmax(a.loads[10:20].sum(axis=0)) != np.argmax(a.loads[:10].sum(axis=0))


def test_static_replay_equals_numpy_and_moves_nothing():
    t = zipf_trace(50, 128, 8, skew=1.2, drift_every=25, seed=1)
    out = simulate(t, "static")
    load = np.stack([np.bincount(t.owners, weights=w, minlength=8) for w in t.loads])
    np.testing.assert_allclose(out["imbalance"].to_numpy(), load.max(axis=1) / load.mean(axis=1))
    np.testing.assert_allclose(out["floor"].to_numpy(), np.maximum(1, 8 * t.loads.max(axis=1) / t.loads.sum(axis=1)))
    assert out["moved_groups"].sum() == 0 and out["epoch"].iloc[-1] == 0


@pytest.mark.parametrize("name", sorted(available_balancers()))
def test_every_balancer_replays_deterministically(name):
    t = zipf_trace(40, 64, 4, keys=5000, skew=1.0, drift_every=20, seed=2)
    a, b = simulate(t, name), simulate(t, name)
    assert a.equals(b)
    assert (a["imbalance"] >= 1 - 1e-12).all()


def test_autoflow_levels_each_drift_within_three_windows():
    t = zipf_trace(300, 1024, 8, skew=1.0, drift_every=100, seed=0)
    out = simulate(t, "autoflow")
    ok = out["imbalance"] <= 1.05 * out["floor"]
    for start in (0, 100, 200):
        assert ok.iloc[start:start + 3].any(), out.iloc[start:start + 5]
    assert summarize({"autoflow": out}).loc["autoflow", "mean_over_floor"] < 1.1
    static = simulate(t, "static")
    assert out["imbalance"].iloc[3:].mean() < static["imbalance"].iloc[3:].mean() - 0.3


def test_trace_round_trips_through_a_file_and_bad_files_are_named(tmp_path):
    t = zipf_trace(12, 32, 4, seed=4)
    t.save(str(tmp_path / "t.npz"))
    back = Trace.load(str(tmp_path / "t.npz"))
    np.testing.assert_array_equal(back.loads, t.loads)
    np.testing.assert_array_equal(back.owners, t.owners)
    assert back.instances == 4 and back.meta["skew"] == 1.2
    (tmp_path / "junk.npz").write_bytes(b"not a trace")
    with pytest.raises(ValueError, match="junk.npz' is not a streamlb trace"):
        Trace.load(str(tmp_path / "junk.npz"))
    with pytest.raises(ValueError, match="must give each of the 32 key groups an instance in 0..3"):
        Trace(t.loads, 4, owners=np.full(32, 9))
    with pytest.raises(ValueError, match="balancer=None replays recorded routing"):
        simulate(t, None)


def test_recorded_trace_from_a_real_job_replays_its_routing_and_its_balancer(cluster2, zipf_path):
    """A job balanced by autoflow records its load; replaying the recorded routing gives the
    plugin's own figures exactly, and replaying the load through autoflow lands within 10% of
    the imbalance the job's routing gave that load. (Against the imbalance of records
    *applied* per window, which batching makes lumpy over a run this short, the figure is
    taken on a long run by asv_bench/benchmarks/simulator.py.)"""
    # 3 s in 200 ms windows: enough windows that one drift's lag (a migration lands a little
    # after its plan; the simulator's at once) does not sway the mean by 10%
    src = Stream.from_parquet(zipf_path, batch_size=5_000, rate=100_000, event_time="event_time")
    src.key_by("key").aggregate({"n": ("value", "count")}, parallelism=4, name="agg")
    with streamlb.run(src, client=cluster2, key_groups=128, window="200ms", balancer="autoflow") as job:
        job.wait(timeout=120)
        trace = job.load_trace("agg")
        windows = job.balancer_state()["operators"]["agg"]["imbalance"]
        with pytest.raises(KeyError, match="no operator named 'nope'; operators in this job: agg"):
            job.load_trace("nope")
    assert trace.windows == len(windows) and trace.instances == 4
    replay = simulate(trace, None)
    np.testing.assert_allclose(replay["imbalance"], [w["planned"] for w in windows], rtol=1e-5)
    np.testing.assert_allclose(replay["measured"], [w["imbalance"] for w in windows])
    full = trace.loads.sum(axis=1) > 0.8 * trace.loads.sum(axis=1).max()    # whole windows only
    sim = simulate(trace, "autoflow")
    job, simulated = replay["imbalance"][full].mean(), sim["imbalance"][full].mean()
    assert abs(simulated - job) <= 0.10 * job, (simulated, job)


def test_cli_simulate_writes_a_plot_and_names_bad_balancers(tmp_path):
    png = tmp_path / "sim.png"
    r = subprocess.run([sys.executable, "-m", "streamlb.cli", "simulate", "--windows", "60", "--key-groups", "256",
                        "--balancers", "static", "autoflow", "--plot", str(png)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "autoflow" in r.stdout and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = subprocess.run([sys.executable, "-m", "streamlb.cli", "simulate", "--balancers", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown balancer 'nope'; valid balancers are" in r.stderr
    assert os.path.exists(png)
