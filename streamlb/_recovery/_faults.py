"""Faults as one notion: what the driver saw go wrong with a checkpointed job, by kind.

Every fault the driver detects is one of these kinds, each answered the same way (a
recovery from the latest complete checkpoint while attempts remain, else a failure):

- ``worker lost``: the scheduler no longer lists a worker holding instances (a crash,
  SIGKILL, OOM, a nanny restart);
- ``peer unreachable``: an instance could not deliver to another one though both workers
  are listed (a network partition): :class:`~streamlb.exceptions.PeerUnreachableError`;
- ``worker unresponsive``: a worker holding instances sent the scheduler no heartbeat for
  ``streamlb.fault.heartbeat-timeout``, or an instance answered no poll for that long (a
  frozen, stopped or stuck process): :class:`~streamlb.exceptions.InstanceUnresponsiveError`;
- ``sink write``: a sink could not write (:class:`~streamlb.exceptions.SinkWriteError`):
  recovered from when it may pass (an I/O error), a failure at once when retrying cannot
  help (no space, no permission, read-only);
- ``instance unreachable``: the driver could not reach an instance (its worker listed).

Errors that are the records' or the user's (a user function that raised, a schema or key
type error) are never faults: the job fails at once. :meth:`FaultLog.frame` is
:meth:`streamlb.Job.failures`.
"""
from __future__ import annotations

import time

from ..exceptions import (InstanceUnresponsiveError, KeyTypeError, PeerUnreachableError, PipelineError, SchemaError,
                          SinkWriteError, UserFunctionError)

# errors that are the records' or the user's, never a lost worker's: no grace period
OWN_FAULT = (UserFunctionError, PipelineError, SchemaError, KeyTypeError)
FAULT_COLUMNS = ["time", "kind", "workers", "detail", "action", "attempt", "checkpoint"]


def kind_of(err: BaseException | None) -> str | None:
    """The fault ``err`` is (None: no fault, the job fails on it). ``err`` None: a worker
    the scheduler no longer lists."""
    if err is None:
        return "worker lost"
    if isinstance(err, OWN_FAULT):
        return None
    if isinstance(err, SinkWriteError):
        return None if err.permanent else "sink write"
    if isinstance(err, PeerUnreachableError):
        return "peer unreachable"
    if isinstance(err, InstanceUnresponsiveError):
        return "worker unresponsive"
    if _network(err):
        return "instance unreachable"
    return None


def _network(err: BaseException) -> bool:
    """Whether ``err`` (or what it was raised from) is the network's: a connection refused,
    closed or timed out."""
    from distributed.comm.core import CommClosedError

    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, (OSError, CommClosedError, TimeoutError)):
            return True
        err, seen = err.__cause__, seen + 1
    return False


def describe(err: BaseException | None) -> str:
    return "" if err is None else f"{type(err).__name__}: {err}"[:500]


class FaultLog:
    """The faults of one job, as :meth:`streamlb.Job.failures` shows them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, kind: str, workers, err: BaseException | None, action: str, attempt: int,
            checkpoint: int | None) -> dict:
        row = {"time": time.time(), "kind": kind, "workers": list(workers), "detail": describe(err),
               "action": action, "attempt": attempt, "checkpoint": checkpoint}
        self.rows.append(row)
        return row

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=FAULT_COLUMNS)
