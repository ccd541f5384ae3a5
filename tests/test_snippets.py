"""Every snippet of README.md and docs/user-guide.md that starts a job runs as a script
(issue 46, item 15).

Each complete ```python block that calls ``streamlb.run`` is saved as ``script.py`` in a
fresh directory, next to small Parquet data under the paths it reads, and run with
``python script.py``: an embedded cluster's worker processes must not run the script again.
A printed state must be pandas' over the same files.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import streamlb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("README.md", os.path.join("docs", "user-guide.md"))


def _scripts() -> list:
    """``(page:line, code)`` of each complete block that starts a job (it imports streamlb;
    the other blocks are fragments of the text around them)."""
    out = []
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            code = m.group(1)
            if "streamlb.run(" in code and re.search(r"^import streamlb$", code, re.M):
                out.append(pytest.param(code, id=f"{page}:{text[:m.start()].count(chr(10)) + 1}"))
    return out


SCRIPTS = _scripts()


def test_the_pages_hold_scripts():
    assert len(SCRIPTS) >= 2, "README.md and the user guide each open with a script that runs a job"


def _data(root: str, code: str) -> pd.DataFrame:
    """Two Parquet files of ``key, value`` under each path the script reads; the rows."""
    rng = np.random.default_rng(46)
    df = pd.DataFrame({"key": rng.zipf(1.5, 4_000) % 50, "value": rng.integers(0, 1_000, 4_000)})
    for path in re.findall(r'from_parquet\("([^"]+)"', code):
        os.makedirs(os.path.join(root, path))
        for i, part in enumerate((df.iloc[:2_500], df.iloc[2_500:])):
            part.to_parquet(os.path.join(root, path, f"part-{i}.parquet"), index=False)
    return df


def _run(where, code: str) -> subprocess.CompletedProcess:
    """``python script.py`` holding ``code`` in directory ``where``, with this streamlb; it
    must exit 0."""
    (where / "script.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(streamlb.__file__))}
    done = subprocess.run([sys.executable, "script.py"], cwd=where, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.parametrize("code", SCRIPTS)
def test_a_snippet_runs_as_a_script(code, tmp_path):
    df = _data(str(tmp_path), code)
    done = _run(tmp_path, code)
    assert "bootstrapping phase" not in done.stderr
    if 'print(job.state("totals").head())' in code:
        want = df.groupby("key").agg(n=("value", "count"), total=("value", "sum")).sort_index().head()
        for key, row in want.iterrows():
            line = rf"^{key}\s+{row.n}\s+{row.total}(\.0)?\s*$"
            assert re.search(line, done.stdout, re.M), f"row {key} {tuple(row)} not printed:\n{done.stdout}"


RESTARTED = '''
import os
from streamz import Stream
import streamlb

with open("ran.txt", "a") as f:
    f.write(f"{os.getpid()}\\n")
src = Stream.from_parquet("data/zipf")
src.key_by("key").aggregate({"n": ("value", "count")}, name="counts")
job = streamlb.run(src, n_workers=2)
job.wait()
print("total", int(job.state("counts").n.sum()))
job.client.restart(wait_for_workers=True, timeout=90)     # each nanny spawns its worker again
print("workers", len(job.client.scheduler_info()["workers"]))
job.stop()
'''


def test_workers_a_nanny_restarts_do_not_run_the_script_either(tmp_path):
    """The script runs once, in the driver: not in the worker processes the cluster starts,
    nor in those its nannies start again later."""
    df = _data(str(tmp_path), RESTARTED)
    done = _run(tmp_path, RESTARTED)
    assert done.stdout.split() == ["total", str(len(df)), "workers", "2"]
    assert len((tmp_path / "ran.txt").read_text().split()) == 1
