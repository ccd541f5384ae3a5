"""A checkpoint names the staged outputs it sealed, and whoever resumes it commits them.

The driver (the process that called ``streamlb.run(..., checkpoint=ck)``) runs in a
subprocess against real `dask scheduler` / `dask worker` processes (a LocalCluster would
die with it) and is SIGKILLed by the coordinator's test hook
(``STREAMLB_TEST_KILL_AFTER_MANIFEST``) right after a checkpoint's manifest is written and
before its staged outputs are committed. The same pipeline then runs again in the test
process with the same ``checkpoint=``, which resumes from that checkpoint: the outputs hold
every record exactly once, against pandas over the same input.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = {"n": ("value", "count"), "s": ("value", "sum")}
ROWS, FILES, KEYS, RATE = 12_000, 2, 500, 8_000
KILL_AT = 2         # the checkpoint after whose manifest the driver dies


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two Parquet files of integer keys; ``rid`` numbers every row."""
    root = tmp_path_factory.mktemp("sealed-data")
    rng = np.random.default_rng(7)
    n = ROWS * FILES
    frame = pd.DataFrame({"key": rng.integers(0, KEYS, n), "value": rng.integers(0, 100, n), "rid": np.arange(n)})
    for i in range(FILES):
        frame.iloc[i * ROWS:(i + 1) * ROWS].to_parquet(os.path.join(root, f"part-{i}.parquet"))
    return str(root), frame


def rows_of(df):
    return df[["rid", "key", "value"]]


def updates_of(df):
    return df.reset_index()


def build(path: str, out: str, sink: str = "parquet", kafka: dict | None = None):
    """A keyed aggregate over ``path``: its update stream out, and the records read."""
    src = Stream.from_parquet(path, batch_size=1_000, rate=RATE)
    updates = src.key_by("key").aggregate(SPEC, name="totals", parallelism=2).map(updates_of)
    records = src.map(rows_of)
    if sink == "parquet":
        updates.to_parquet(os.path.join(out, "updates"))
        records.to_parquet(os.path.join(out, "records"))
    else:
        updates.to_kafka_topic(kafka["updates"], {"bootstrap.servers": kafka["bootstrap"]})
        records.to_kafka_topic(kafka["records"], {"bootstrap.servers": kafka["bootstrap"]})
    return src


DRIVER = """
import sys
sys.path.insert(0, {here!r})
import streamlb
from test_sealed_outputs import build

job = streamlb.run(build({path!r}, {out!r}, {sink!r}, {kafka!r}), address={address!r}, checkpoint={ck!r},
                   checkpoint_interval=0.3, balancer="static")
job.wait(timeout=120)
print("FINISHED", flush=True)
"""


def _killed_driver(tmp_path, address: str, path: str, out: str, ck: str, sink: str = "parquet",
                   kafka: dict | None = None) -> None:
    """Run the job in a driver process that the hook SIGKILLs after checkpoint KILL_AT's manifest."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER).format(here=HERE, path=path, out=out, ck=ck, sink=sink,
                                                     kafka=kafka, address=address))
    env = dict(os.environ, STREAMLB_TEST_KILL_AFTER_MANIFEST=str(KILL_AT))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == -9, f"the driver was not killed at the hook ({r.returncode}):\n{r.stderr[-3000:]}"
    from streamlb._checkpoint._manifest import read_manifest

    manifest, _ = read_manifest(ck)
    assert manifest["id"] >= KILL_AT
    # it sealed outputs that the dead driver never committed
    sealed = manifest["outputs"][sink]
    assert sealed if sink == "parquet" else sum(t["messages"] for t in sealed["transactions"])


def _resume(address: str, node, ck: str):
    """The same pipeline on the same checkpoint directory: it resumes from the latest checkpoint."""
    job = streamlb.run(node, address=address, checkpoint=ck, checkpoint_interval=0.3, balancer="static")
    job.wait(timeout=120)
    return job


def _check(frame: pd.DataFrame, records: pd.DataFrame, updates: pd.DataFrame, state: pd.DataFrame) -> None:
    """Every input record once among the records written; the aggregate's state and the last
    update of each key as pandas computes them; each (key, count) update at most once."""
    assert len(records) == len(frame), (len(records), len(frame))
    assert records["rid"].is_unique and set(records["rid"]) == set(frame["rid"])
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    np.testing.assert_array_equal(state["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(state["s"].to_numpy(), truth["sum"].to_numpy())
    assert not updates.duplicated(["key", "n"]).any()
    last = updates.sort_values("n").groupby("key").last()
    np.testing.assert_array_equal(last["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(last["s"].to_numpy(), truth["sum"].to_numpy())


@pytest.mark.cluster
def test_to_parquet_outputs_sealed_by_a_checkpoint_are_committed_by_the_run_that_resumes_it(
        cli_cluster, data, tmp_path):
    path, frame = data
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    _killed_driver(tmp_path, cli_cluster, path, out, ck)
    job = _resume(cli_cluster, build(path, out), ck)
    records = pd.read_parquet(os.path.join(out, "records"))
    updates = pd.read_parquet(os.path.join(out, "updates"))
    _check(frame, records, updates, job.state("totals"))
    for name in ("records", "updates"):       # nothing left staged: the dead driver's files too
        assert not os.path.exists(os.path.join(out, name, "_temporary"))


@pytest.mark.cluster
def test_to_kafka_topic_transactions_sealed_by_a_checkpoint_are_committed_by_the_run_that_resumes_it(
        cli_cluster, data, kafka, tmp_path):
    """The dead driver's instances never commit the transactions the checkpoint sealed, and
    leave others open: the resumed run fences their transactional ids and writes the sealed
    ones again from what the checkpoint kept; read_committed sees every record once."""
    from kafka_broker import topic_name

    path, frame = data
    ck = str(tmp_path / "ck")
    topics = {"bootstrap": kafka.bootstrap, "updates": kafka.create_topic(topic_name("updates"), partitions=2),
              "records": kafka.create_topic(topic_name("records"), partitions=2)}
    _killed_driver(tmp_path, cli_cluster, path, "", ck, sink="kafka", kafka=topics)
    job = _resume(cli_cluster, build(path, "", "kafka", topics), ck)
    read = {name: pd.DataFrame([json.loads(v) for _, _, _, v in kafka.read_all(topics[name])])
            for name in ("records", "updates")}
    _check(frame, read["records"], read["updates"], job.state("totals"))


@pytest.mark.cluster
def test_a_worker_lost_between_a_checkpoint_and_its_kafka_commit_loses_no_row(data, kafka, tmp_path):
    """The driver lives; a worker dies (the sink's test hook) after a checkpoint completed,
    before its instance committed that checkpoint's transaction. The recovery resumes that
    checkpoint and writes the transaction again from what it kept: each record once."""
    from conftest import dask_cli_cluster
    from kafka_broker import topic_name

    path, frame = data
    flag = tmp_path / "killed"
    topics = {"bootstrap": kafka.bootstrap, "updates": kafka.create_topic(topic_name("updates"), partitions=2),
              "records": kafka.create_topic(topic_name("records"), partitions=2)}
    with dask_cli_cluster(env={"STREAMLB_TEST_KILL_BEFORE_KAFKA_COMMIT": str(flag)}) as address:
        job = _resume(address, build(path, "", "kafka", topics), str(tmp_path / "ck"))
        state = job.state("totals")
    assert flag.exists() and [h["kind"] for h in job.history if h.get("kind") == "recovery"] == ["recovery"]
    read = {name: pd.DataFrame([json.loads(v) for _, _, _, v in kafka.read_all(topics[name])])
            for name in ("records", "updates")}
    _check(frame, read["records"], read["updates"], state)


# -- the committers' resume, idempotent --------------------------------------------------------
def _plan(parquet=(), kafka=None):
    """A plan with ``to_parquet`` paths and one ``to_kafka_topic`` step (``kafka``: its kwargs)."""
    from types import SimpleNamespace

    from streamlb._plan._step import Step

    steps = [Step("kafka_sink", target=0, kwargs=kafka)] if kafka else []
    return SimpleNamespace(parquet_paths=list(parquet), list_sinks={},
                           stages=[SimpleNamespace(children=steps, late=[])])


def test_a_parquet_commit_stopped_half_way_is_completed_once_and_the_rest_of_temporary_dropped(tmp_path):
    from streamlb._sinks import Committers

    out = tmp_path / "out"
    (out / "_temporary").mkdir(parents=True)
    staged = [out / "_temporary" / f"part-000-000{i}-abc-c00001.parquet" for i in range(3)]
    for i, f in enumerate(staged):
        pd.DataFrame({"rid": [i]}).to_parquet(f)
    later = out / "_temporary" / "part-000-0000-abc-c00002.parquet"      # staged after the checkpoint
    pd.DataFrame({"rid": [9]}).to_parquet(later)
    committers = Committers(_plan([str(out)]), [], job="new")
    recorded = committers.sealed([{"files": [[str(out), str(f)]]} for f in staged], None, 1)
    os.replace(staged[0], out / staged[0].name)         # the dead driver moved one of them
    for _ in range(2):
        committers.resume(recorded, None)
        assert sorted(pd.read_parquet(out)["rid"]) == [0, 1, 2]
        assert not os.listdir(out / "_temporary")


def test_kafka_transactions_sealed_are_written_again_once_and_open_ones_aborted(kafka, tmp_path):
    """Of two transactions a checkpoint sealed, the writer committed the first (with its
    mark) and left the second open, with a third one after the checkpoint: a resume writes
    the second again and aborts the third; a second resume writes nothing."""
    from kafka_broker import topic_name
    from streamlb._sinks import Committers
    from streamlb._sinks._kafka import connection, send_mark

    topic = kafka.create_topic(topic_name("sealed"))
    config = {"bootstrap.servers": kafka.bootstrap}
    prefix = f"streamlb-{topic}-0-0-k0"
    batches = {slot: ([f"{slot}-{i}".encode() for i in range(3)], [None] * 3) for slot in range(3)}
    group = kafka.consumer(**connection(config), **{"group.id": prefix}).consumer_group_metadata()
    producers = [kafka.producer(**{"transactional.id": f"{prefix}-s{slot}"}) for slot in range(3)]
    for slot, p in enumerate(producers):
        p.init_transactions(10)
        p.begin_transaction()
        for v in batches[slot][0]:
            p.produce(topic, v)
        p.flush(10)
    send_mark(producers[0], topic, 4, group)        # sealed by checkpoint 4, committed
    producers[0].commit_transaction(10)
    part = {"kafka": [{"topic": topic, "prefix": prefix, "slots": 4,
                       "sealed": [{"slot": 0, "mark": 4, "messages": [batches[0]]},
                                  {"slot": 1, "mark": 5, "messages": [batches[1]]}]}]}

    def keep(name, write):
        with open(tmp_path / name, "wb") as fh:
            write(fh)
        return str(tmp_path / name)
    committers = Committers(_plan(kafka={"topic": topic, "producer_config": config}), [], job="new")
    recorded = committers.sealed([part], keep, 5)
    for _ in range(2):
        committers.resume(recorded, lambda path: open(path, "rb"))
        got = sorted(v for _, _, _, v in kafka.read_all(topic, timeout=10))
        assert got == sorted(batches[0][0] + batches[1][0])


def test_a_manifest_of_an_earlier_version_or_of_a_savepoint_commits_nothing():
    """Manifests written before ``outputs`` existed still restore: nothing to commit (the job,
    None here, is not touched); a savepoint's outputs commit with its job's next checkpoint."""
    from streamlb._recovery._restore import resume_outputs

    resume_outputs(None, {"format": 1, "kind": "checkpoint", "id": 3, "files": {}, "operators": {}}, "/nowhere")
    resume_outputs(None, {"kind": "savepoint", "outputs": {"parquet": [["/a", "/b"]]}}, "/nowhere")
