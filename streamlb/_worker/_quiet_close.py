"""A worker plugin for the embedded cluster: its workers close without a spurious error.

A worker that closes while a heartbeat to the scheduler is in flight closes its own
connection pool under that heartbeat, and distributed logs the broken heartbeat as an
error with a traceback ("Failed to communicate with scheduler during heartbeat"). When
``run`` closes the cluster it started (the job finished, was stopped, or Ctrl-C), that
record says nothing is wrong: the filter drops it, and only while the worker is closing.
Every other record, and that one from a running worker, is still logged.
"""
from __future__ import annotations

import logging
import weakref

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["QuietClose"]

_HEARTBEAT = "Failed to communicate with scheduler during heartbeat"


class _ClosingHeartbeat(logging.Filter):
    def __init__(self, worker) -> None:
        super().__init__()
        self.worker = weakref.ref(worker)

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_HEARTBEAT):
            return True
        worker = self.worker()
        return worker is not None and getattr(worker.status, "name", "") not in ("closing", "closed")


class QuietClose(WorkerPlugin):
    """Passed as ``plugins=`` to the embedded cluster's workers."""

    name = "streamlb-quiet-close"

    def setup(self, worker) -> None:
        # kept when the plugin is torn down: a worker removes its plugins before it closes
        # its connections, which is when the record comes
        logging.getLogger("distributed.worker").addFilter(_ClosingHeartbeat(worker))
