"""A corrupt newest checkpoint manifest (issue 49, item 7): a run on the same ``checkpoint=``
skips it with a warning naming the file and what is wrong, and resumes exactly from the
previous complete checkpoint; when none is usable, or ``restore=`` names a corrupt one, the
error lists every checkpoint found with why each is unusable.

The checkpoints are those of a real run on LocalCluster worker processes, stopped part of
the way; the resumed state is checked exactly against pandas."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time

import numpy as np
import pytest
from streamz import Stream

import streamlb
from streamlb import CheckpointError
from streamlb._checkpoint._manifest import MANIFEST, checkpoint_ids

from test_checkpoint import SPEC, data  # noqa: F401  (the module's Parquet input, a fixture)


def build(path):
    src = Stream.from_parquet(path, batch_size=4_000, rate=30_000)
    src.key_by("key").aggregate(SPEC, name="totals", parallelism=2)
    return src


@pytest.fixture(scope="module")
def stopped(two_workers, data, tmp_path_factory):  # noqa: F811
    """The checkpoint directory of a run stopped once it holds three complete checkpoints."""
    path, _ = data
    ck = str(tmp_path_factory.mktemp("fallback") / "ck")
    job = streamlb.run(build(path), client=two_workers, checkpoint=ck, checkpoint_interval=0.25)
    deadline = time.time() + 60
    while len(checkpoint_ids(ck)) < 3 and job.status == "running" and time.time() < deadline:
        time.sleep(0.05)
    job.stop()
    assert len(checkpoint_ids(ck)) >= 3, "the run ended before three checkpoints"
    return ck


def _copy(stopped, tmp_path) -> tuple[str, list[str]]:
    ck = str(tmp_path / "ck")
    shutil.copytree(stopped, ck)
    return ck, [os.path.join(ck, f"chk-{i:06d}", MANIFEST) for i in checkpoint_ids(ck)]


def _spoil(manifest: str, how: str) -> None:
    """Truncate the manifest, overwrite it with garbage, or (``checksum``) flip a byte of a
    snapshot file that its checkpoint wrote (the manifest's crc32 of it no longer holds)."""
    if how == "checksum":
        cid = int(os.path.basename(os.path.dirname(manifest))[4:])
        files = json.load(open(manifest))["files"]
        own = [f for f in files if f.endswith(f"-c{cid:06d}.arrow")]
        manifest = os.path.join(os.path.dirname(manifest), "..", own[0])
    raw = bytearray(open(manifest, "rb").read())
    if how == "checksum":
        raw[len(raw) // 2] ^= 0xFF
    with open(manifest, "wb") as fh:
        fh.write(raw[: len(raw) // 2] if how == "truncated" else os.urandom(len(raw)) if how == "garbage" else raw)


@pytest.mark.parametrize("how", ["truncated", "garbage", "checksum"])
def test_a_corrupt_newest_manifest_falls_back_to_the_previous_checkpoint(two_workers, data, stopped,  # noqa: F811
                                                                         tmp_path, caplog, how):
    path, frame = data
    ck, manifests = _copy(stopped, tmp_path)
    _spoil(manifests[-1], how)
    with caplog.at_level(logging.WARNING, logger="streamlb.checkpoint"):
        job = streamlb.run(build(path), client=two_workers, checkpoint=ck, checkpoint_interval=10)
        job.wait(timeout=120)
    said = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert said and os.path.dirname(manifests[-1]) in said[0], said
    assert ("crc32" if how == "checksum" else "not valid JSON") in said[0]
    assert f"chk-{checkpoint_ids(stopped)[-2]:06d}" not in said[0]
    truth = frame.groupby("key")["value"].agg(["count", "sum"])
    state = job.state("totals")
    assert state.index.tolist() == truth.index.tolist()
    np.testing.assert_array_equal(state["n"].to_numpy(), truth["count"].to_numpy())
    np.testing.assert_array_equal(state["s"].to_numpy(), truth["sum"].to_numpy())
    job.stop()


def test_no_usable_checkpoint_or_a_corrupt_one_named_lists_them_all(two_workers, data, stopped, tmp_path):  # noqa: F811
    path, _ = data
    ck, manifests = _copy(stopped, tmp_path)
    _spoil(manifests[-1], "truncated")
    names = [os.path.basename(os.path.dirname(m)) for m in manifests]
    # restore= naming the corrupt one: refused, the usable ones listed
    with pytest.raises(CheckpointError) as err:
        streamlb.run(build(path), client=two_workers, restore=os.path.dirname(manifests[-1]))
    msg = str(err.value)
    assert msg.startswith(f"checkpoint manifest {manifests[-1]} is not valid JSON")
    for name in names[:-1]:
        assert f"{name}: usable" in msg
    # every manifest spoilt: each named with its reason
    for m in manifests[:-1]:
        _spoil(m, "garbage")
    with pytest.raises(CheckpointError) as err:
        streamlb.run(build(path), client=two_workers, checkpoint=ck)
    msg = str(err.value)
    assert msg.startswith(f"no usable checkpoint under {ck}")
    for name, m in zip(names, manifests):
        assert f"{name}: checkpoint manifest {m} is not valid JSON" in msg
