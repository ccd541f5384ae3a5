"""The package as a new user meets it: lazy submodules, the top-level `simulate`, plots that
leave matplotlib's backend alone, the command line's --version and checked choices, the
licence, and a quiet exit with a job left running."""
import configparser
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import streamlb
from streamlb import latency

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_submodules_load_on_first_use_without_pyspark_or_matplotlib():
    r = _python("""
        import sys
        import streamlb
        assert "pyspark" not in sys.modules and "matplotlib" not in sys.modules
        assert "streamlb.datasets" not in sys.modules
        assert callable(streamlb.datasets.zipf) and callable(streamlb.datasets.nexmark)
        assert "pyspark" not in sys.modules          # datasets imports PySpark when it runs
        assert streamlb.simulator.Trace is not None and streamlb.scaler.Scaler is not None
        assert "datasets" in dir(streamlb) and "simulate" in dir(streamlb)
        try:
            streamlb.nope
        except AttributeError as e:
            assert "has no attribute 'nope'" in str(e)
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_simulate_is_a_top_level_function_equal_to_the_simulators():
    from streamlb.simulator import simulate, zipf_trace

    trace = zipf_trace(30, 128, 4, skew=1.2, drift_every=10, seed=1)
    got = streamlb.simulate(trace, balancer="autoflow", instances=4)
    assert streamlb.simulate is simulate and "simulate" in streamlb.__all__
    want = simulate(trace, "autoflow", 4)
    np.testing.assert_array_equal(got["imbalance"].to_numpy(), want["imbalance"].to_numpy())
    # the static replay is the trace's own load per instance, by numpy
    static = streamlb.simulate(trace, balancer="static", instances=4)
    per = np.stack([trace.loads[:, trace.owners == i].sum(axis=1) for i in range(4)], axis=1)
    np.testing.assert_allclose(static["imbalance"].to_numpy(), per.max(axis=1) / per.mean(axis=1))


def test_plots_return_figures_and_leave_the_backend_alone(tmp_path):
    """A notebook's backend stays what it was: no matplotlib.use, no pyplot."""
    png = tmp_path / "sim.png"
    r = _python(f"""
        import sys
        import matplotlib
        matplotlib.use("svg")
        from matplotlib.figure import Figure
        from streamlb.simulator import plot, simulate, zipf_trace
        trace = zipf_trace(20, 64, 4, seed=0)
        fig = plot({{"static": simulate(trace, "static")}}, {str(png)!r}, title="t")
        assert isinstance(fig, Figure)
        again = plot({{"static": simulate(trace, "static")}})          # no path: nothing written
        assert isinstance(again, Figure)
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert "matplotlib.pyplot" not in sys.modules
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_percentiles_against_numpy_on_a_known_sample():
    rng = np.random.default_rng(7)
    lat = rng.lognormal(3.0, 1.0, 20_000)                  # ms
    h = latency.histogram(lat)
    step = 2 ** 0.25                                        # one bin
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        exact = np.quantile(lat, q, method="inverted_cdf")
        assert exact / step <= latency.quantile(h, q) <= exact * step, q
    # q = 0: the lower edge of the first bin used, not of the first bin
    i = int(np.flatnonzero(h)[0])
    assert i > 0 and latency.quantile(h, 0) == latency.EDGES_MS[i] <= lat.min() < latency.EDGES_MS[i + 1]
    # the demo's p99 is of every record, from the summed histograms; a p99 of per-window p99s is not
    windows = [rng.lognormal(2.0, 0.3, 5000), rng.lognormal(5.0, 0.3, 100)]
    summed = sum(latency.histogram(w) for w in windows)
    exact = np.quantile(np.concatenate(windows), 0.99, method="inverted_cdf")
    assert exact / step <= latency.quantile(summed, 0.99) <= exact * step


def test_version_module_entry_point_and_checked_choices():
    r = subprocess.run([sys.executable, "-m", "streamlb", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"streamlb {streamlb.__version__}"
    r = subprocess.run([sys.executable, "-m", "streamlb", "demo", "--migration", "teleport"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argument --migration: invalid choice: 'teleport'" in r.stderr
    assert "'all-at-once', 'fluid', 'lazy', 'pause'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "streamlb", "demo", "--balancers", "static", "nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown balancer 'nope'; valid balancers are autoflow, greedy" in r.stderr


def test_licence_file_matches_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert cfg["metadata"]["license"] == "BSD-3-Clause"
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert text.startswith("BSD 3-Clause License") and "Neither the name of the copyright holder" in text


@pytest.mark.timeout(180)
def test_exit_with_a_job_left_running_is_quiet(tmp_path):
    """The job is stopped before Dask closes the embedded cluster: no refused retirement,
    no reconnect attempts, no traceback."""
    r = _python("""
        import numpy as np, pandas as pd, time
        from streamz import Stream
        import streamlb
        if __name__ == "__main__":
            pd.DataFrame({"key": np.arange(100_000) % 500, "value": 1.0}).to_parquet("in.parquet")
            src = Stream.from_parquet("in.parquet", rate=20_000)
            src.key_by("key").aggregate({"n": ("value", "count")}, name="n")
            job = streamlb.run(src, n_workers=2)
            time.sleep(1.5)
            assert job.status == "running"
            print("leaving", flush=True)
    """, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "leaving", r.stderr[-3000:]
    for noise in ("Traceback", "ERROR", "Failed to reconnect", "retirement refused"):
        assert noise not in r.stderr, r.stderr[-3000:]


def test_dependency_bounds_admit_patch_releases():
    """No exact pins on the Dask stack; pandas bounded above (the key index uses its private
    hash tables); matplotlib only in the plot extra."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    reqs = [r.strip() for r in cfg["options"]["install_requires"].splitlines()
            if r.strip() and not r.strip().startswith("#")]
    by_name = {r.split("[")[0].split("~")[0].split(">")[0].split("<")[0].split("=")[0]: r for r in reqs}
    for name in ("dask", "distributed", "streamz"):
        assert "==" not in by_name[name] and "~=" in by_name[name], by_name[name]
    assert "<" in by_name["pandas"]
    assert "matplotlib" not in by_name
    extras = cfg["options.extras_require"]
    assert "matplotlib" in extras["plot"] and "bokeh" in extras["dashboard"]


def test_plotting_without_matplotlib_says_which_extra_to_install():
    r = _python("""
        import sys
        sys.modules["matplotlib"] = None          # as if it were not installed
        sys.modules["matplotlib.figure"] = None
        from streamlb.simulator import plot, simulate, zipf_trace
        try:
            plot({"static": simulate(zipf_trace(5, 16, 2), "static")})
        except ImportError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    assert "plotting needs matplotlib" in r.stdout and 'pip install "streamlb[plot]"' in r.stdout
