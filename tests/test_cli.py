"""`streamlb demo --rescale`: a live 2 -> 6 rescale, its plot, and the final state against pandas."""
import re
import subprocess
import sys

import pytest


@pytest.mark.spark
def test_demo_rescale_plots_and_ends_exact(zipf_path, zipf_frame, tmp_path):
    png = tmp_path / "rescale.png"
    r = subprocess.run([sys.executable, "-m", "streamlb.cli", "demo", "--rescale", "--data", zipf_path,
                        "--rate", "100000", "--plot", str(png)],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"plot of instances and load over time: {png}" in r.stdout
    # the demo compares its final state with pandas over the same files; the key count is
    # checked here against the test's own read of them
    line = re.search(r"rescaled 'totals' 2 -> 6 live in [\d.]+ s \((\w+), (\d+) of 256 key groups moved\).*"
                     r"final state of ([\d,]+) keys equals pandas over the same files", r.stdout)
    assert line, r.stdout[-3000:]
    strategy, moved, keys = line.groups()
    assert strategy == "lazy"
    assert int(moved) == 256 - 2 * 43          # each of the 2 old instances keeps 43 of its 128 groups
    assert int(keys.replace(",", "")) == zipf_frame.key.nunique()


def test_demo_rescale_rejects_a_bad_spec():
    for bad in ("3", "2:x", "4:4", "0:2"):
        r = subprocess.run([sys.executable, "-m", "streamlb.cli", "demo", "--rescale", bad],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--rescale" in r.stderr, (bad, r.stderr)
