"""What a read of keyed state costs in memory, and whether it fits where it is built.

``job.state(op)`` builds each instance's state as one DataFrame on its worker, sends it, and
the driver joins the parts. For state in RocksDB that frame is the whole database in memory
at once; a worker of ``memory_limit="1GiB"`` holding 15M keys was restarted by its nanny in
the middle of the read (the caller saw "Unable to contact Actor's worker"). So a read is
first estimated — rows times the bytes of a row of the frame — and refused where the frame
would not fit in the memory left to the process that builds it (twice: the frame and its
copy on the way out): the worker's ``memory_limit`` less what the process holds, never more
than the machine has available. The estimate is by dtype: 8 bytes a number, 64 a Python
object (a string key); it errs high, since a refused read costs a retry by key groups, a
read that does not fit costs a worker.
"""
from __future__ import annotations

__all__ = ["OBJECT_BYTES", "READ_COPIES", "free_memory", "frame_bytes", "fits"]

OBJECT_BYTES = 64           # a Python object in a frame (its pointer, a short str or tuple)
READ_COPIES = 2             # the frame, and its copy on the way out (or the parts and their join)


def frame_bytes(rows: int, kinds) -> int:
    """Bytes of a frame of ``rows`` rows whose index and columns have the numpy dtype kinds
    ``kinds`` (``"O"`` an object, anything else 8 bytes)."""
    return int(rows) * sum(OBJECT_BYTES if k in "OUS" else 8 for k in kinds)


def free_memory(limit: int | None = None) -> int:
    """Bytes this process may still take: ``limit`` (a Dask worker's ``memory_limit``; None
    outside a worker or without one) less its resident set, at most what the machine has
    available."""
    import psutil

    available = psutil.virtual_memory().available
    if not limit:
        return int(available)
    return int(max(min(limit - psutil.Process().memory_info().rss, available), 0))


def fits(nbytes: int, free: int) -> bool:
    """Whether a frame of ``nbytes`` may be built with ``free`` bytes left (see the module)."""
    return nbytes * READ_COPIES <= free
