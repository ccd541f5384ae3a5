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

A move is the other kind of work: it frees arrays of many megabytes (cut state, shipped
blobs, tables outgrown) that the next batches do not ask for again, and they stayed
resident as holes in the heap (a worker's peak during a fluid move of half its state was
1.25 times its steady resident set with the pad, 1.10 without). So an instance calls
:func:`give_back` when a move is done on it, which trims the heap off the event loop once
the resident set has grown by more than the pad since the last trim.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3    # mallopt's parameter numbers in glibc's malloc.h
MMAP_MAX = 32 << 20                     # the largest mmap threshold glibc takes on 64 bits
_applied: int | None = None
_trimmed_at: int | None = None          # resident bytes after the heap last gave memory back
_trimming = threading.Lock()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def keep_heap(pad: int) -> bool:
    """Ask glibc to keep ``pad`` bytes of freed heap when it trims; True if it took the
    value (now or earlier in this process)."""
    global _applied
    if not pad or sys.platform != "linux":
        return False
    if _applied == pad:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
        took = (libc.mallopt(M_MMAP_THRESHOLD, min(int(pad), MMAP_MAX)) == 1
                and libc.mallopt(M_TOP_PAD, int(pad)) == 1)
    except (OSError, AttributeError):   # not glibc (musl has no mallopt)
        return False
    if took:
        _applied = pad
    return took


def _resident() -> int:
    """This process's resident set in bytes (``/proc/self/statm``), 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def give_back() -> None:
    """After a move: once the resident set has grown by more than the pad since the heap
    last gave memory back, hand its free pages to the kernel (``malloc_trim``). A move cuts,
    ships and installs arrays of many megabytes, which, kept by the pad, would stay resident
    as holes in the heap for as long as the worker lives. Where :func:`keep_heap` did not
    take, the default trimming already gives them back."""
    global _trimmed_at
    if not _applied:
        return
    rss = _resident()
    if _trimmed_at is None:
        _trimmed_at = rss
    elif rss - _trimmed_at > _applied and not _trimming.locked():
        _trimmed_at = rss
        threading.Thread(target=_trim, daemon=True).start()


def _trim() -> None:
    """``malloc_trim`` off the event loop (ctypes lets the GIL go for the call)."""
    global _trimmed_at
    with _trimming:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            return
        _trimmed_at = _resident()


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
