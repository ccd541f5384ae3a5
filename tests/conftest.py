"""Shared fixtures: one PySpark session, datasets it prepares, real Dask clusters."""
from __future__ import annotations

import contextlib
import gc
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

import pandas as pd
import pytest

warnings.filterwarnings("ignore", message=".*does not yet fully support pandas.*")

pytest_plugins = ["conftest_kafka"]      # the Kafka tests' broker (a noida-db process per session)

HERE = os.path.dirname(os.path.abspath(__file__))
THIRD_PARTY = os.path.join(HERE, "..", "examples", "third_party_balancer")


def _install_third_party_balancer() -> str:
    """Install examples/third_party_balancer the way pip lays a package out (the module and
    a ``.dist-info`` holding its entry points) into a fresh directory put on ``sys.path``,
    before test modules collect the registered balancers. Nothing is fetched or built."""
    import tempfile
    import tomllib

    with open(os.path.join(THIRD_PARTY, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    site = tempfile.mkdtemp(prefix="streamlb-third-party-")
    shutil.copytree(os.path.join(THIRD_PARTY, "src", "hottest_to_coldest"), os.path.join(site, "hottest_to_coldest"))
    info = os.path.join(site, f"{project['name'].replace('-', '_')}-{project['version']}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, eps in project["entry-points"].items():
            f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    sys.path.insert(0, site)
    return site


THIRD_PARTY_SITE = _install_third_party_balancer()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def spark():
    from streamlb import datasets

    return datasets.spark_session()


@pytest.fixture(scope="session")
def nexmark_path(spark, tmp_path_factory):
    """NEXMark's three tables, 20k events over 100 s of event time: ten tumbling windows,
    sessions. At 201 events/s some bids fall exactly on window boundaries (every 402nd
    event is on a 2 s boundary)."""
    from streamlb import datasets

    path = str(tmp_path_factory.mktemp("data") / "nexmark")
    datasets.nexmark(path, events=20_000, partitions=2, seed=5, rate=201)
    return path


@pytest.fixture(scope="session")
def zipf_path(spark, tmp_path_factory):
    """300k rows of drifting Zipf(1.2) over 20k keys in 4 log partitions, made by PySpark."""
    from streamlb import datasets

    path = str(tmp_path_factory.mktemp("data") / "zipf")
    datasets.zipf(path, rows=300_000, keys=20_000, skew=1.2, partitions=4, drift_every=100_000, seed=7)
    return path


@pytest.fixture(scope="session")
def zipf_frame(zipf_path) -> pd.DataFrame:
    """The same rows read by pandas: the independent ground truth."""
    return pd.read_parquet(zipf_path, columns=["key", "value", "event_time"])


@pytest.fixture(scope="session")
def disordered(spark, tmp_path_factory):
    """60k records over 300 keys in 8 files, 10% of them delayed by up to 3 s of event time."""
    from streamlb import datasets

    path = str(tmp_path_factory.mktemp("data") / "disordered")
    datasets.zipf(path, rows=60_000, keys=300, skew=1.1, partitions=8, seed=3, disorder=3.0)
    return path


@pytest.fixture(scope="session")
def disordered_frame(disordered) -> pd.DataFrame:
    return pd.read_parquet(disordered, columns=["key", "value", "event_time"])


@pytest.fixture(scope="module")
def two_workers():
    """A LocalCluster of 2 worker processes for one test module."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as c:
        yield c


@pytest.fixture(scope="session", params=[1, 2], ids=["1-worker", "2-workers"])
def client(request):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=request.param, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c


def tls_security(tls):
    """The ``distributed.security.Security`` of a client holding ``(ca_file, cert_file, key_file)``."""
    from distributed.security import Security

    return Security(tls_ca_file=tls[0], tls_client_cert=tls[1], tls_client_key=tls[2], require_encryption=True)


def client_refusal(address, security=None) -> tuple[type, str]:
    """The error a ``Client`` connecting to ``address`` with ``security`` fails with, as its
    type and message. The failed Client is collected here, with nothing else holding it:
    its ``__del__`` takes the lock every ``Client`` start holds (``LoopRunner._lock``,
    distributed 2026.8), so collected during the next Client's start it deadlocks it."""
    from distributed import Client

    try:
        Client(address, timeout="3s", security=security).close()
    except Exception as exc:
        refusal = type(exc), str(exc)
    else:
        pytest.fail(f"a client with {security!r} was let in at {address}")
    gc.collect()
    return refusal


@contextlib.contextmanager
def dask_cli_cluster(scheduler_args=(), env=None, workers=2, tls=None):
    """`dask scheduler` and `dask worker` processes on loopback, started as a user would.

    ``tls``: ``(ca_file, cert_file, key_file)``; every process then listens on ``tls://``
    with that certificate (``--tls-ca-file``, ``--tls-cert``, ``--tls-key``).
    Yields the scheduler address once ``workers`` workers joined.
    """
    port = free_port()
    protocol = "tls" if tls else "tcp"
    address = f"{protocol}://127.0.0.1:{port}"
    tls_args = ["--tls-ca-file", tls[0], "--tls-cert", tls[1], "--tls-key", tls[2]] if tls else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]), **(env or {}))
    dask = shutil.which("dask") or os.path.join(os.path.dirname(sys.executable), "dask")
    logs = os.environ.get("STREAMLB_CLUSTER_LOGS")    # a directory: each process's output there

    def out(name: str) -> dict:
        if not logs:
            return {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        os.makedirs(logs, exist_ok=True)
        f = open(os.path.join(logs, f"{port}-{name}.log"), "ab")
        return {"env": env, "stdout": f, "stderr": subprocess.STDOUT}

    procs = [subprocess.Popen([dask, "scheduler", "--protocol", protocol, "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0", *tls_args, *scheduler_args], **out("scheduler"))]
    try:
        for i in range(workers):
            procs.append(subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--protocol", protocol,
                                           "--host", "127.0.0.1", "--dashboard-address", ":0", *tls_args],
                                          **out(f"worker{i}")))
        from distributed import Client

        security = tls_security(tls) if tls else None
        deadline = time.time() + 60
        while True:
            try:
                c = Client(address, timeout=5, security=security)
                break
            except OSError:
                if time.time() > deadline:
                    raise
            gc.collect()    # the failed Client now, not while the next one starts (see client_refusal)
            time.sleep(0.5)
        with c:
            c.wait_for_workers(workers, timeout=60)
        yield address
    finally:
        # the workers first, while their scheduler is there to see them go: a worker whose
        # scheduler went first is killed by its nanny only after 8 s
        for group in (procs[1:], procs[:1]):
            for p in group:
                p.terminate()
            deadline = time.time() + 10
            for p in group:
                try:
                    p.wait(timeout=max(deadline - time.time(), 0.1))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)


@pytest.fixture(scope="session")
def cli_cluster():
    """A `dask scheduler` and two `dask worker` processes on loopback."""
    with dask_cli_cluster() as address:
        yield address


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (long property-based runs) run only with STREAMLB_SLOW=1."""
    if os.environ.get("STREAMLB_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set STREAMLB_SLOW=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
