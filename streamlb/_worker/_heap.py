"""Keep freed memory for the next batch: glibc's ``M_TOP_PAD`` in a worker process.

Dask's nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so glibc hands the top of the heap back to the
kernel as soon as 64 KiB of it are free. A data path of large batches frees megabytes after
every batch and asks for them again for the next one; each page taken again is a page
fault; and the same setting fixes the size above which an allocation is a mapping of its
own (128 KiB), unmapped when freed, so every array of a batch is faulted in page by page.
On the 40M-row aggregate of ``benchmarks.peers`` each worker took about 85,000 faults a
run, a fifth of its CPU time. Here the heap keeps ``M_TOP_PAD`` bytes of free memory at
its top when it trims (the trimming above that still happens), and allocations up to the
same size (at most 32 MiB) come from the heap.

The pad is process-wide and stays after the job; the setting ``streamlb.worker.heap-pad``
(default 64 MiB, ``0`` leaves the process as it is) sets it where an instance starts.
Elsewhere than Linux with glibc it does nothing.
"""
from __future__ import annotations

import sys

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3    # mallopt's parameter numbers in glibc's malloc.h
MMAP_MAX = 32 << 20                     # the largest mmap threshold glibc takes on 64 bits
_applied: int | None = None


def keep_heap(pad: int) -> bool:
    """Ask glibc to keep ``pad`` bytes of freed heap when it trims; True if it took the
    value (now or earlier in this process)."""
    global _applied
    if not pad or sys.platform != "linux":
        return False
    if _applied == pad:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        took = (libc.mallopt(M_MMAP_THRESHOLD, min(int(pad), MMAP_MAX)) == 1
                and libc.mallopt(M_TOP_PAD, int(pad)) == 1)
    except (OSError, AttributeError):   # not glibc (musl has no mallopt)
        return False
    if took:
        _applied = pad
    return took


def heap_pad() -> int:
    """The setting ``streamlb.worker.heap-pad`` in bytes (an int, or a string such as
    ``"64MiB"``); a PipelineError naming it if it is neither."""
    from dask.utils import parse_bytes

    from .. import config
    from ..exceptions import PipelineError

    value = config.get("worker.heap-pad")
    try:
        n = 0 if value in (0, None, False) else int(parse_bytes(value))
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(value, bool) and value:
        raise PipelineError(f"setting streamlb.worker.heap-pad: must be a size in bytes (an int >= 0, or a "
                            f"string such as '64MiB'; 0 turns it off), got {value!r}")
    return n
