"""``RemoteJob``: a handle on a job the cluster runs, from any process.

Every call goes to the scheduler's job registry over the Dask comm (TLS where the cluster
uses it); those that need the job itself are relayed to its driver, which runs them on its
:class:`~streamlb.Job` and answers. What a handle reads of a job's status comes from the
registry's record, which the driver refreshes every ``streamlb.jobs.heartbeat``.
"""
from __future__ import annotations

import time

import pandas as pd

from .._jobs._record import ACTIVE
from ..exceptions import JobFailedError, JobServiceError

__all__ = ["RemoteJob", "connect"]


def connect(address=None, client=None, security=None, timeout=None):
    """``(client, owned)``: ``client``, or a new one of the scheduler at ``address``."""
    if client is not None:
        return client, False
    if address is None:
        raise JobServiceError("give the scheduler's address (address=, or --address on the command line): jobs "
                              "live on a cluster, not in this process")
    from distributed import Client

    from .. import config
    from ..exceptions import SchedulerUnreachableError

    timeout = config.seconds("connect-timeout", timeout)
    try:
        return Client(address, timeout=timeout, security=security, set_as_default=False), True
    except (OSError, TimeoutError) as exc:
        import gc

        why = f"{type(exc).__name__}: {exc}"
        gc.collect()
    raise SchedulerUnreachableError(f"no Dask scheduler answered at {address!r} within {timeout:g}s ({why})")


def scheduler_call(client, op: str, **kw):
    """Request ``op`` of the scheduler's job registry; a clear error if it has none."""
    handler = getattr(client.scheduler, op)
    try:
        return client.sync(handler, **kw)
    except (KeyError, ValueError) as exc:
        if op in str(exc) or "unknown operation" in str(exc).lower():
            raise JobServiceError(
                f"the scheduler at {client.scheduler.address} runs no streamlb job registry: start it with "
                "`dask scheduler --preload streamlb.plugin [--streamlb-jobs-dir DIR]`, or submit a job there "
                "(streamlb.submit registers one)") from None
        raise


class RemoteJob:
    """A job submitted to a cluster (:func:`streamlb.submit`, :func:`streamlb.attach`).

    It has the :class:`~streamlb.Job` methods that make sense from another process; each
    runs in the job's driver. ``stop()`` ends the job gracefully (what its sources read is
    processed and committed; ``savepoint=`` writes a savepoint at that point), ``cancel()``
    aborts it. The handle holds no part of the job: closing it, or the process that holds
    it, changes nothing for the job.
    """

    def __init__(self, client, name: str, owns_client: bool = False) -> None:
        self.client, self.name, self._owns = client, name, owns_client

    # -- the record ------------------------------------------------------------------------------
    def describe(self) -> dict:
        """The registry's record of the job: ``name``, ``id``, ``status``, ``restarts``,
        ``error``, ``driver`` (pid, log, incarnation), ``info`` (what its driver last
        reported: parallelism per operator, records, records/s, last checkpoint...)."""
        return scheduler_call(self.client, "streamlb_jobs_get", name=self.name)

    @property
    def status(self) -> str:
        return self.describe()["status"]

    @property
    def error(self) -> str | None:
        return self.describe()["error"]

    @property
    def id(self) -> str:
        return self.describe()["id"]

    def wait(self, timeout=None, poll: float = 0.5) -> RemoteJob:
        """Until the job ended: return if it finished or was cancelled, raise
        :class:`JobFailedError` with its error if it failed, ``TimeoutError`` after
        ``timeout`` (the job keeps running)."""
        from .._time import duration_s

        deadline = None if timeout is None else time.time() + duration_s(timeout, "RemoteJob.wait: timeout")
        while True:
            rec = self.describe()
            if rec["status"] == "failed":
                raise JobFailedError(f"job {self.name!r} failed: {rec['error']}")
            if rec["status"] not in ACTIVE:
                return self
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"job {self.name!r} still {rec['status']} after {timeout}")
            time.sleep(poll)

    def running(self, timeout: float = 60.0) -> RemoteJob:
        """Until the job's driver runs it (it may be starting or restarting), or it ended
        (a short job may end first): raise as :meth:`wait` if it failed."""
        deadline = time.time() + timeout
        while True:
            rec = self.describe()
            if rec["status"] == "failed":
                raise JobFailedError(f"job {self.name!r} failed: {rec['error']}")
            if rec["status"] == "running" or rec["status"] not in ACTIVE:
                return self
            if time.time() > deadline:
                raise TimeoutError(f"job {self.name!r} still {rec['status']} after {timeout:g} s")
            time.sleep(0.2)

    # -- calls run by the driver -----------------------------------------------------------------
    def _call(self, method: str, *args, timeout=None, **kwargs):
        import pickle

        import cloudpickle

        payload = cloudpickle.dumps((args, kwargs))
        answer = scheduler_call(self.client, "streamlb_jobs_call", name=self.name, method=method,
                                payload=payload, timeout=timeout)
        value = pickle.loads(answer["payload"]) if answer.get("payload") is not None else None
        if not answer["ok"]:
            raise value
        return value

    def stop(self, savepoint: str | None = None):
        """End the job gracefully: its sources stop reading, what they read is processed
        and its outputs committed; with ``savepoint``, a savepoint is written at that point
        (restore it with ``submit(..., restore=savepoint)``). Returns the savepoint's path."""
        return self._call("drain", savepoint=savepoint)

    def cancel(self) -> None:
        """Abort the job: its instances stop and nothing more is committed."""
        self._call("cancel")

    def savepoint(self, path: str) -> str:
        return self._call("savepoint", path)

    def rescale(self, operator: str, parallelism: int, strategy: str | None = None, workers=None) -> int:
        return self._call("rescale", operator, parallelism, strategy, workers)

    def move_instance(self, operator: str, instance: int, worker: str) -> None:
        return self._call("move_instance", operator, instance, worker)

    def drain_worker(self, worker: str) -> list[dict]:
        """Move every instance of the job off ``worker`` (before it is retired)."""
        return self._call("drain_worker", worker)

    def update(self, operator: str, func) -> None:
        return self._call("update", operator, func)

    def migrate(self, operator: str, key_groups, to_instance: int, strategy: str | None = None):
        return self._call("migrate", operator, list(key_groups), to_instance, strategy)

    def parallelism(self, operator: str) -> int:
        return self._call("parallelism", operator)

    def metrics(self) -> pd.DataFrame:
        return self._call("metrics")

    def imbalance(self, operator: str) -> pd.DataFrame:
        return self._call("imbalance", operator)

    def state(self, operator: str, key_groups=None) -> pd.DataFrame:
        """As :meth:`streamlb.Job.state`; the rows travel through the scheduler, so read a
        large state by ``key_groups``, a slice at a time."""
        return self._call("state", operator, None if key_groups is None else list(key_groups))

    def checkpoints(self) -> pd.DataFrame:
        return self._call("checkpoints")

    @property
    def history(self) -> list[dict]:
        return self._call("history")

    def dead_letters(self) -> pd.DataFrame:
        return self._call("dead_letters")

    def watermarks(self) -> pd.DataFrame:
        return self._call("watermarks")

    def summary(self) -> dict:
        return self._call("summary")

    def routing(self, operator: str):
        return self._call("routing", operator)

    # -- the handle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the client this handle opened (the job runs on)."""
        if self._owns:
            self.client.close()

    def __enter__(self) -> RemoteJob:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteJob {self.name!r} on {self.client.scheduler.address}>"
