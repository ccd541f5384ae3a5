"""`streamlb nexmark QUERY`: the real command in a subprocess, on 20k events prepared by
PySpark in a temporary directory, exact against PySpark; its refusals."""
import re
import subprocess
import sys

import pytest


def nexmark(*args, cwd, timeout=180):
    return subprocess.run([sys.executable, "-m", "streamlb.cli", "nexmark", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.spark
def test_queries_run_timed_and_exact_against_pyspark_reusing_the_prepared_tables(tmp_path):
    data = tmp_path / "data"
    for query, prepares in (("q3", True), ("q8", False)):
        r = nexmark(query, "--events", "20000", "--data", str(data), cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        said = ("preparing 20,000 NEXMark events (seed 0) with PySpark" if prepares
                else "reusing 20,000 NEXMark events (seed 0)")
        assert said in r.stdout, r.stdout
        # events as NEXMark counts them: the whole log; q3 and q8 read its person and auction
        # tables, 1 + 3 of every 50 events
        assert re.search(r"throughput: 20,000 events in [\d.]+ s = [\d,]+ events/s, [\d,]+ events/s per core "
                         r"\(\d cores; 1,600 rows read from person, auction\)", r.stdout), r.stdout
        assert re.search(rf"{query}_join +p50 +[\d.]+ +p99 +[\d.]+ +max +[\d.]+", r.stdout), r.stdout
        assert re.search(r"output: [\d,]+ rows, exact against PySpark", r.stdout), r.stdout
    assert [p.name for p in data.iterdir()] == ["events-20000-seed-0"]


def test_an_unknown_query_or_a_bad_number_is_refused_naming_the_valid_ones(tmp_path):
    r = nexmark("q9", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'q9'" in r.stderr and "'q11'" in r.stderr, r.stderr
    r = nexmark("q3", "--events", "0", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--events" in r.stderr and "above 0" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())
