"""What a read of keyed state costs in memory, and whether it fits where it is built.

``job.state(op)`` builds each instance's state as one DataFrame on its worker, sends it, and
the driver joins the parts. For state in RocksDB that frame is the whole database in memory
at once; a worker of ``memory_limit="1GiB"`` holding 15M keys was restarted by its nanny in
the middle of the read (the caller saw "Unable to contact Actor's worker"). So a read is
first estimated — rows times the bytes of a row of the frame — and refused where the frame
would not fit in the memory left to the process that builds it: on the worker,
``WORKER_COPIES`` times the frame (building a RocksDB store's frame peaked at 3.3 times it,
measured with tracemalloc over 2M keys: the scan's raw rows, the decoded chunks, their join,
the frame; then it is sent), below the point where its nanny restarts it
(``distributed.worker.memory.terminate`` of its ``memory_limit``, less what the process
holds, never more than the machine has available); in the driver, ``DRIVER_COPIES`` times
the parts (they, and their join). The estimate is by dtype: 8 bytes a number, 64 a Python
object (a string key); it errs high, since a refused read costs a retry by key groups, a
read that does not fit costs a worker.
"""
from __future__ import annotations

__all__ = ["OBJECT_BYTES", "WORKER_COPIES", "DRIVER_COPIES", "free_memory", "frame_bytes", "fits"]

OBJECT_BYTES = 64           # a Python object in a frame (its pointer, a short str or tuple)
WORKER_COPIES = 4           # a worker's peak building and sending a frame, in frames
DRIVER_COPIES = 2           # the driver's: the parts and their join


def frame_bytes(rows: int, kinds) -> int:
    """Bytes of a frame of ``rows`` rows whose index and columns have the numpy dtype kinds
    ``kinds`` (``"O"`` an object, anything else 8 bytes)."""
    return int(rows) * sum(OBJECT_BYTES if k in "OUS" else 8 for k in kinds)


def free_memory(limit: int | None = None) -> int:
    """Bytes this process may still take: up to where a Dask nanny restarts a worker of
    ``memory_limit`` ``limit`` (None: outside a worker, or none), less its resident set, at
    most what the machine has available."""
    import dask.config
    import psutil

    available = psutil.virtual_memory().available
    if not limit:
        return int(available)
    terminate = dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0
    return int(max(min(limit * terminate - psutil.Process().memory_info().rss, available), 0))


def fits(nbytes: int, free: int, copies: int) -> bool:
    """Whether ``copies`` frames of ``nbytes`` fit in ``free`` bytes (see the module)."""
    return nbytes * copies <= free
