"""`streamlb demo --rescale`: a live 2 -> 6 rescale, its plot, and the final state against pandas."""
import os
import re
import signal
import subprocess
import sys
import time

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


def test_demo_rescale_rejects_a_bad_spec(capsys):
    """The command line's own parser, in this process (a subprocess each took 1.5 s)."""
    from streamlb import cli

    for bad in ("3", "2:x", "4:4", "0:2"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["demo", "--rescale", bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "--rescale" in err, (bad, err)


@pytest.mark.spark
def test_ctrl_c_during_the_demo_stops_its_job_and_exits_130(zipf_path, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "streamlb.cli", "demo", "--data", zipf_path, "--rate", "20000",
                          "--plot", str(tmp_path / "demo.png")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                         start_new_session=True)
    try:
        for line in p.stdout:
            if "open-loop source at" in line:       # the first job runs
                break
        time.sleep(2.0)
        t0 = time.time()
        os.killpg(p.pid, signal.SIGINT)        # as a terminal's Ctrl-C: to the whole group
        _, err = p.communicate(timeout=30)
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-3000:]
    assert took < 10, took
    assert "interrupted" in err and "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "demo.png").exists()
