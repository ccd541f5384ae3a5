"""Every example under examples/ runs to completion (each checks its own result)."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_runs(path, tmp_path, request):
    env = dict(os.environ)
    if "kafka" in os.path.basename(path):           # it reads a topic: the tests' broker
        env["STREAMLB_KAFKA_BOOTSTRAP"] = request.getfixturevalue("kafka").bootstrap
    r = subprocess.run([sys.executable, path, str(tmp_path)], capture_output=True, text=True,
                       timeout=240, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
