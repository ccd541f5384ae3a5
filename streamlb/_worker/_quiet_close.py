"""A worker plugin for the embedded cluster: its workers close without a spurious error.

A worker that closes while a heartbeat to the scheduler is in flight closes its own
connection pool under that heartbeat, and distributed logs the broken heartbeat as an
error with a traceback ("Failed to communicate with scheduler during heartbeat"). When
``run`` closes the cluster it started (the job finished, was stopped, or Ctrl-C), that
record says nothing is wrong: the filter drops it, and only while the worker is closing.
Every other record, and that one from a running worker, is still logged.

The second record is a call that reaches a worker after the streamlb actor it was for was
freed: a message one instance sent another, or a driver's poll, still on its way when the
job stopped and let its actors go ("Exception while handling op actor_execute", a
``KeyError`` naming a ``streamlb-`` actor key the worker no longer holds). The caller gets
the same error back in the reply, so the worker's log adds nothing; it failed the demo's
Ctrl-C test once in CI. The filter drops it only when the key is of a streamlb actor and
that actor is gone from the worker.
"""
from __future__ import annotations

import logging
import weakref

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["QuietClose"]

_HEARTBEAT = "Failed to communicate with scheduler during heartbeat"
_ACTOR_CALL = "Exception while handling op actor_execute"


class _OfWorker(logging.Filter):
    """A filter that looks at its worker (held weakly)."""

    def __init__(self, worker) -> None:
        super().__init__()
        self.worker = weakref.ref(worker)


class _ClosingHeartbeat(_OfWorker):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_HEARTBEAT):
            return True
        worker = self.worker()
        return worker is not None and getattr(worker.status, "name", "") not in ("closing", "closed")


class _CallToAFreedActor(_OfWorker):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_ACTOR_CALL) or not record.exc_info:
            return True
        exc = record.exc_info[1]
        key = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
        worker = self.worker()
        if not isinstance(key, str) or not key.startswith("streamlb-") or worker is None:
            return True
        return key in worker.state.actors


class QuietClose(WorkerPlugin):
    """Passed as ``plugins=`` to the embedded cluster's workers."""

    name = "streamlb-quiet-close"

    def setup(self, worker) -> None:
        # kept when the plugin is torn down: a worker removes its plugins before it closes
        # its connections, which is when the record comes
        logging.getLogger("distributed.worker").addFilter(_ClosingHeartbeat(worker))
        logging.getLogger("distributed.core").addFilter(_CallToAFreedActor(worker))
