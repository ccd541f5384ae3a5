"""`streamlb nexmark QUERY`: the command's `main` on 20k events prepared by PySpark in a
temporary directory, exact against PySpark (in the test process, whose PySpark session it
reuses: a subprocess would start its own JVM for each run, ~15 s); its refusals, from the
real command in a subprocess."""
import re
import subprocess
import sys

import pytest

from streamlb import cli


def nexmark(*args, cwd, timeout=180):
    return subprocess.run([sys.executable, "-m", "streamlb.cli", "nexmark", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.spark
def test_queries_run_timed_and_exact_against_pyspark_reusing_the_prepared_tables(spark, tmp_path, capsys):
    data = tmp_path / "data"
    for query, prepares in (("q3", True), ("q8", False)):
        code = cli.main(["nexmark", query, "--events", "20000", "--data", str(data)])
        r = capsys.readouterr()
        assert code == 0, r.out[-3000:] + r.err[-3000:]
        said = ("preparing 20,000 NEXMark events (seed 0) with PySpark" if prepares
                else "reusing 20,000 NEXMark events (seed 0)")
        assert said in r.out, r.out
        # events as NEXMark counts them: the whole log; q3 and q8 read its person and auction
        # tables, 1 + 3 of every 50 events
        assert re.search(r"throughput: 20,000 events in [\d.]+ s = [\d,]+ events/s, [\d,]+ events/s per core "
                         r"\(\d cores; 1,600 rows read from person, auction\)", r.out), r.out
        assert re.search(rf"{query}_join +p50 +[\d.]+ +p99 +[\d.]+ +max +[\d.]+", r.out), r.out
        assert re.search(r"output: [\d,]+ rows, exact against PySpark", r.out), r.out
    assert [p.name for p in data.iterdir()] == ["events-20000-seed-0"]


def test_an_unknown_query_or_a_bad_number_is_refused_naming_the_valid_ones(tmp_path):
    r = nexmark("q9", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'q9'" in r.stderr and "'q11'" in r.stderr, r.stderr
    r = nexmark("q3", "--events", "0", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "--events" in r.stderr and "above 0" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())
