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


def _holes_given_back(pad: int = 64 << 20) -> tuple[int, int, int]:
    """Resident bytes before, with 256 MiB of freed holes in the heap, and after
    ``give_back`` (each hole is pinned by a small array after it, so trimming the top of
    the heap cannot reach it)."""
    import time

    import numpy as np

    from streamlb._worker import _heap

    assert _heap.keep_heap(pad)
    _heap._trimmed_at = None
    _heap.give_back()                       # the first call notes where the heap stands
    before = _heap._resident()
    big, pins = [], []
    for _ in range(128):
        big.append(np.ones(2 << 17))        # 2 MiB, from the heap (under the mmap threshold)
        pins.append(np.ones(4096))      # 32 KiB: from malloc (numpy caches tiny buffers)
    big.clear()
    holes = _heap._resident()
    _heap.give_back()
    deadline = time.time() + 10
    while time.time() < deadline and (_heap._trimming.locked() or _heap._resident() > holes - (128 << 20)):
        time.sleep(0.05)
    return before, holes, _heap._resident()


def test_a_worker_gives_back_the_holes_a_move_leaves_in_its_heap(two_workers):
    """After a move (``give_back``, called where an epoch is done on an instance), freed
    arrays kept as holes in the heap go back to the kernel once they exceed the pad."""
    for worker, (before, holes, after) in two_workers.run(_holes_given_back).items():
        assert holes - before > 200 << 20, (worker, before, holes)
        assert holes - after > 180 << 20, (worker, before, holes, after)
