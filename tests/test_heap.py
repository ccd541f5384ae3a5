"""A worker that ran an instance keeps freed heap between batches (streamlb/_worker/_heap.py,
setting ``streamlb.worker.heap-pad``): arrays of a batch's size are not faulted in again
page by page, as they are under Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` alone."""
from __future__ import annotations

import sys

import pytest
from streamz import Stream

import streamlb

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")


def _faults_per_batch(mib: int = 4) -> float:
    """Page faults of taking and freeing two arrays of ``mib`` MiB, averaged over 10 times."""
    import resource

    import numpy as np

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    for _ in range(3):
        a = np.ones(mib << 17)
        del a
    before = faults()
    for _ in range(10):
        a = np.ones(mib << 17)
        b = a * 2
        del a, b
    return (faults() - before) / 10


def test_a_worker_running_an_instance_keeps_its_freed_heap(two_workers):
    pages = (2 * 4 << 20) // 4096                      # what faulting both arrays in takes
    src = Stream.from_iterable([{"k": i % 3, "v": 1} for i in range(30)])
    src.key_by("k").aggregate({"n": ("v", "count")}, name="totals")
    with streamlb.run(src, client=two_workers) as job:
        job.wait(timeout=60)
        assert job.state("totals")["n"].sum() == 30
    for worker, faults in two_workers.run(_faults_per_batch).items():
        assert faults < pages / 10, (worker, faults, pages)
