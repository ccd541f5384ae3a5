"""Reads of keyed state that would not fit (issue 50): ``job.state`` estimates the frame each
instance would build and refuses a read that does not fit in the memory free on a worker or in
the driver (``streamlb.state.read-memory`` caps it here, so that a small state can stand for
a large one), with a ``StateTooLargeError`` saying how many key groups a read may take; the
state is intact afterwards and reads by key groups return all of it, exact against pandas.
The same read of 30M keys on workers of ``memory_limit="1GiB"`` is measured in docs/state.md.
"""
from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import pytest
from streamz import Stream

import streamlb
from streamlb.exceptions import PipelineError, StateTooLargeError

pytestmark = pytest.mark.cluster

N_KEYS = 100_000
SPEC = {"n": ("v", "count"), "s": ("v", "sum")}


def _data() -> pd.DataFrame:
    rng = np.random.default_rng(50)
    return pd.DataFrame({"k": rng.permutation(N_KEYS * 2) % N_KEYS, "v": rng.integers(0, 1000, N_KEYS * 2)})


def _job(client, backend: str):
    data = _data()
    src = Stream.from_iterable([data.iloc[i:i + 50_000] for i in range(0, len(data), 50_000)])
    src.key_by("k").aggregate(SPEC, name="agg")
    src.key_by("k").stateful_map(lambda st, r: ((st or 0) + 1, None), name="seen")
    return streamlb.run(src, client=client, parallelism=2, key_groups=64, state_backend=backend), data


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_read_that_does_not_fit_is_refused_and_the_state_is_read_by_key_groups(two_workers, backend):
    job, data = _job(two_workers, backend)
    with job:
        job.wait(timeout=180)
        want = data.groupby("k").agg(**SPEC)
        with dask.config.set({"streamlb.state.read-memory": "1MiB"}):
            with pytest.raises(StateTooLargeError) as info:
                job.state("agg")
            err = info.value
            msg = str(err)
            assert "job.state('agg') refused (all of its state)" in msg and "Nothing was read" in msg, msg
            assert "key_groups=range(a, a + " in msg and "job.state_size('agg')" in msg, msg
            assert err.operator == "agg" and 1 <= err.groups_per_read < 64 and err.nbytes > err.free / 2, msg
            per = err.groups_per_read
            parts = [job.state("agg", key_groups=range(a, min(a + per, 64))) for a in range(0, 64, per)]
            with pytest.raises(StateTooLargeError, match=r"A stateful_map's state is read whole"):
                job.state("seen")
        got = pd.concat(parts).sort_index()
        pd.testing.assert_frame_equal(got, want, check_index_type=False)
        pd.testing.assert_frame_equal(job.state("agg"), want, check_index_type=False)     # intact, uncapped
        assert sum(job.state_size("seen").values()) == N_KEYS
        print(f"\n{backend}: refused a whole read ({err.nbytes / 2**20:.1f} MiB in an instance), "
              f"read back {per} key groups at a time")


def test_an_instance_rechecks_the_estimate_and_a_bad_setting_is_named(two_workers):
    """The driver passes its estimate along with the read; an instance whose worker has less
    free by then refuses rather than build the frame. A read-memory that is no size is named."""
    job, _ = _job(two_workers, "memory")
    with job:
        job.wait(timeout=180)
        st = job.plan.stage("agg")
        with pytest.raises(StateTooLargeError, match=r"state of agg\[0\]: a frame of about .* does not fit"):
            job.actors[(st.id, 0)].state(None, 1 << 50).result()
        with dask.config.set({"streamlb.state.read-memory": "lots"}):
            with pytest.raises(PipelineError, match=r"streamlb.state.read-memory='lots': give a size in bytes"):
                job.state("agg")
        assert len(job.state("agg")) == N_KEYS
