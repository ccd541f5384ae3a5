"""Sources meet bad input and say so, on worker processes: a file of another schema in a
watched directory is set aside as a dead letter naming it while the job reads on (exact
against pandas over the other files), once across a restore; a corrupt Parquet file in a
fixed input is refused naming it; an unreachable Kafka broker fails within
``streamlb.kafka.timeout``, naming the address and the setting, without a traceback in the
message or librdkafka's lines on stderr."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from streamz import Stream

import streamlb
from streamlb import InputPathError
from streamlb._checkpoint._manifest import read_manifest

from test_directory_source import _frame, _job, _land, _wait_exact


def test_a_file_of_another_schema_in_a_watched_directory_is_a_dead_letter(two_workers, tmp_path):
    root = tmp_path / "landing"
    root.mkdir()
    good = [_frame(i, 2_000) for i in range(5)]
    for i in range(2):
        _land(root, f"part-{i}.parquet", good[i])
    job = _job(root, two_workers)
    try:
        _wait_exact(job, good[:2])
        bad = {   # no value column; a float key; values as strings: each another schema
            "bad-missing.parquet": good[0].rename(columns={"value": "amount"}),
            "bad-float-key.parquet": good[1].assign(key=good[1].key + 0.5),
            "bad-text.parquet": good[2].assign(value=good[2].value.astype(str)),
        }
        for name, df in bad.items():
            _land(root, name, df)
        for i in range(2, 5):
            _land(root, f"part-{i}.parquet", good[i])
        _wait_exact(job, good)
        deadline = time.time() + 20
        while len(dead := job.dead_letters()) < len(bad) and time.time() < deadline:
            time.sleep(0.2)
        assert len(dead) == len(bad), dead
        files = sorted(os.path.basename(r["file"]) for r in dead.record)
        assert files == sorted(bad)
        why = {os.path.basename(r["file"]): reason for r, reason in zip(dead.record, dead.reason)}
        assert "'value'" in why["bad-missing.parquet"] and "amount" in why["bad-missing.parquet"]
        assert "'key'" in why["bad-float-key.parquet"] and "double" in why["bad-float-key.parquet"]
        assert "'value'" in why["bad-text.parquet"] and "string" in why["bad-text.parquet"]
        for r in dead.record:
            assert set(r["columns"]) == set(bad[os.path.basename(r["file"])].columns)
            assert set(r["expected"]) == {"key", "value"}
        time.sleep(0.5)
        assert job.status == "running" and job.error is None
        _wait_exact(job, good)      # nothing of the bad files was counted meanwhile
        sp = job.savepoint(str(tmp_path / "savepoint"))
    finally:
        job.stop()
    # a file set aside counts as read: a restore neither reads it nor sets it aside again
    manifest, _ = read_manifest(sp)
    done = {f for pos in manifest["sources"]["from_parquet(landing)"] for f in pos["directory"]["done"]}
    assert set(bad) <= done, done
    more = _frame(5, 2_000)
    _land(root, "part-5.parquet", more)
    job = _job(root, two_workers, restore=sp)
    try:
        _wait_exact(job, good + [more])
        time.sleep(0.5)
        assert job.dead_letters().empty and job.status == "running"
    finally:
        job.stop()


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_corrupt_parquet_file_in_a_fixed_input_is_refused_naming_it(two_workers, tmp_path, which):
    root = tmp_path / "input"
    root.mkdir()
    for i in range(3):
        _frame(i, 2_000).to_parquet(root / f"part-{i}.parquet")
    whole = (root / "part-0.parquet").read_bytes()
    name = "a-corrupt.parquet" if which == "first" else "z-corrupt.parquet"
    (root / name).write_bytes(whole[: len(whole) // 2])      # cut short: no footer
    src = Stream.from_parquet(str(root), event_time="value")
    src.key_by("key").aggregate({"n": ("value", "count")}, name="totals")
    with pytest.raises(InputPathError) as err:
        streamlb.run(src, client=two_workers)
    msg = str(err.value)
    assert str(root / name) in msg and "not a readable Parquet file" in msg and "start with '_'" in msg, msg


_KAFKA_RUN = """
import json, sys, time
import dask.config
from distributed import Client, LocalCluster
from streamz import Stream
import streamlb

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \\
            Client(cl) as c:
        src = Stream.from_kafka_topic("orders", {"bootstrap.servers": sys.argv[1]}, decode="json")
        src.key_by("customer").aggregate({"n": ("customer", "count")}, name="counts")
        t0 = time.time()
        try:
            with dask.config.set({"streamlb.kafka.timeout": "1s"}):
                job = streamlb.run(src, client=c)
            job.wait(timeout=60)
            out = {"type": None}
        except Exception as e:
            out = {"type": type(e).__name__, "streamlb": isinstance(e, streamlb.StreamlbError),
                   "connection": isinstance(e, ConnectionError), "message": str(e)}
        out["seconds"] = time.time() - t0
        print(json.dumps(out))
"""


def test_an_unreachable_kafka_broker_fails_within_the_setting_naming_it(tmp_path):
    with socket.socket() as s:          # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(_KAFKA_RUN))
    here = os.path.dirname(os.path.dirname(os.path.abspath(streamlb.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script), address], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["type"] is not None and out["streamlb"] and out["connection"], out
    assert address in out["message"] and "streamlb.kafka.timeout" in out["message"], out["message"]
    assert "Traceback" not in out["message"], out["message"]
    assert out["seconds"] < 8, out     # 1 s asked: not the 10 s of a fixed look-up timeout
    flood = [line for line in proc.stderr.splitlines() if "rdkafka" in line]
    assert len(flood) <= 2, "\n".join(flood[:20])
