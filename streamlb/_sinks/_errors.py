"""A sink's failed write, named: the ``OSError`` of a file a sink writes or commits becomes
a :class:`~streamlb.exceptions.SinkWriteError` that says which sink, which path and why,
with no traceback, and whether retrying can help (:data:`PERMANENT`)."""
from __future__ import annotations

import errno
import os

from ..exceptions import SinkWriteError

#: errnos a retry cannot cure: no space, no quota, a read-only file system, no permission
PERMANENT = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def errno_name(exc: OSError) -> str:
    """``"ENOSPC"`` for an ``OSError`` of errno 28; ``""`` when it has none."""
    return errno.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno else ""


def is_permanent(code: int | None) -> bool:
    """Whether a write that failed with errno ``code`` would fail again if retried.

    >>> is_permanent(errno.ENOSPC), is_permanent(errno.EIO), is_permanent(None)
    (True, False, False)
    """
    return code in PERMANENT


def write_error(sink: str, path: str, exc: OSError, doing: str = "write") -> SinkWriteError:
    """The error of sink ``sink`` (as the user sees it, e.g. ``to_parquet('out') in
    agg[1]``) that could not ``doing`` ``path``: ``exc`` as its cause, chained."""
    name = errno_name(exc)
    cause = f"{name}: {os.strerror(exc.errno)}" if exc.errno else f"{type(exc).__name__}: {exc}"
    retry = "retrying cannot help" if is_permanent(exc.errno) else "it may succeed if retried"
    err = SinkWriteError(f"{sink} could not {doing} {path}: {cause} ({retry})", sink=sink, path=path,
                         errno_name=name, permanent=is_permanent(exc.errno))
    err.__cause__ = exc
    return err
