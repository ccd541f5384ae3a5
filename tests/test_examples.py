"""Every example under examples/ runs to completion (each checks its own result).

The examples run as the subprocesses a user would start, two at a time (each mostly waits:
on a JVM starting, on a paced source), so the module takes about a third less (143 -> 97-115 s); each test
waits for its own and checks how it ended.
"""
import glob
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))
#: started first, in this order: the two that start PySpark's JVM (reading_imbalance,
#: zipf_aggregate) kept apart by two long ones; the rest after, by name
FIRST = ("reading_imbalance.py", "rescale.py", "checkpoint_restore.py", "zipf_aggregate.py")
TIMEOUT = 240


def _run(path: str, workdir: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, path, workdir], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=workdir, env=env)


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """Each selected example's run (a future), two at a time."""
    chosen = {item.callspec.params["path"] for item in request.session.items
              if getattr(item, "originalname", None) == "test_example_runs"
              and hasattr(item, "callspec")}
    order = sorted(chosen, key=lambda p: (FIRST.index(os.path.basename(p)) if os.path.basename(p) in FIRST
                                          else len(FIRST), p))
    pool = ThreadPoolExecutor(2)
    runs = {}
    for path in order:
        name = os.path.basename(path)
        env = dict(os.environ)
        if "kafka" in name:           # it reads a topic: the tests' broker
            env["STREAMLB_KAFKA_BOOTSTRAP"] = request.getfixturevalue("kafka").bootstrap
        workdir = str(tmp_path_factory.mktemp(name.removesuffix(".py")))
        runs[name] = pool.submit(_run, path, workdir, env)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_runs(path, started):
    r = started[os.path.basename(path)].result(timeout=len(EXAMPLES) * TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
