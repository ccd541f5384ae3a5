"""Letting go of a job's instances, and knowing when its cluster is gone.

:class:`Release` stops instances and drops the job's references to their actors (so the
workers free them and Dask no longer counts them when it retires workers), releases the
instances of a finished job whose workers retire (reading their state then raises
:class:`~streamlb.exceptions.JobReleasedError`, with :meth:`Release.reason`), says why the
scheduler can no longer be reached, and closes the client and cluster ``run`` started.
Every wait on the scheduler or the instances is bounded.
"""
from __future__ import annotations

import logging
import time

from .. import config

__all__ = ["Release"]

logger = logging.getLogger("streamlb.job")

_ENDED = {"done": "had finished", "failed": "had failed", "stopped": "was stopped"}


class Release:
    """The instances ``job`` let go of, and the state of its cluster."""

    def __init__(self, job) -> None:
        self.job = job
        self.gone: str | None = None            # why the cluster can no longer be reached
        self.released: set[str] = set()         # retired workers whose instances were let go
        # instances rescaled away whose outputs (Kafka transactions) wait for the next checkpoint
        self.lingering: dict[tuple, tuple] = {}     # (stage, index) -> (actor, future, run)
        self.last_runs: dict[tuple, int] = {}        # run of each instance rescaled away

    def cluster_gone(self) -> str | None:
        """See :meth:`streamlb.Job.cluster_gone`."""
        if self.gone is not None:
            return self.gone
        job = self.job
        status = getattr(job.client, "status", "closed")
        if status not in ("running", "newly-created"):
            return f"its client was closed (status {status!r})"
        if job.cluster is not None and str(getattr(job.cluster, "status", "")).endswith(("closed", "closing")):
            return "its cluster was closed"
        return None

    def actors(self, keys=None, timeout: float = 5.0) -> None:
        """Stop the instances ``keys`` (all by default, and those lingering: what their sinks
        hold is aborted), waiting at most ``timeout`` seconds in all, and let go of
        their actors: the workers free them, and Dask no longer counts them when retiring
        the workers."""
        actors = self.job.actors
        if keys is None:
            self._let_go(list(self.lingering), "stop", timeout)
        keys = list(actors) if keys is None else [k for k in keys if k in actors]
        self.stop_instances(keys, timeout)
        self.forget(keys)

    # -- instances rescaled away, with outputs waiting for a checkpoint ----------------------------
    def linger(self, key) -> None:
        """Instance ``key`` is rescaled away but holds outputs (Kafka transactions) that commit with the
        next checkpoint: it leaves the job's instances and stays until then."""
        job = self.job
        self.lingering[key] = (job.actors.pop(key), job._futures.pop(key, None), job.runs.get(key, 0))
        self.retired(key)
        job.workers_of.pop(key, None)

    def retired(self, key) -> None:
        """Instance ``key`` is rescaled away: a later one at its index takes a new run."""
        self.last_runs[key] = self.job.runs.pop(key, 0)

    def next_run(self, keys) -> int:
        """The incarnation for new instances ``keys``: above that of any instance there
        before (whose actor, lingering or just released, may still hold its key)."""
        return max((self.last_runs[k] + 1 for k in keys if k in self.last_runs), default=0)

    def checkpoint_complete(self, cid: int) -> None:
        """Checkpoint ``cid`` completed: the lingering instances commit and go."""
        self._let_go([k for k in self.lingering], "forget_checkpoint", config.seconds("stop-timeout"), cid)

    def finished(self) -> None:
        """The job finished: the lingering instances commit and go."""
        self._let_go(list(self.lingering), "commit_outputs", config.seconds("stop-timeout"))

    def hand_off(self, key):
        """A new instance takes index ``key`` of one lingering: the outputs that one has not
        committed, for the new one to write first (``{}`` if none lingers there)."""
        if key not in self.lingering:
            return {}
        actor = self.lingering[key][0]
        try:
            return actor.hand_off_outputs().result(timeout=config.seconds("stop-timeout"))
        finally:
            self._let_go([key], "stop", 1.0)

    def _let_go(self, keys, call: str, timeout: float, *args) -> None:
        deadline = time.time() + timeout
        for k in keys:
            actor, future, _ = self.lingering.pop(k)
            try:
                getattr(actor, call)(*args).result(timeout=max(deadline - time.time(), 0.05))
                if call != "stop":
                    actor.stop().result(timeout=max(deadline - time.time(), 0.05))
            except Exception as exc:        # its worker is gone: the broker aborts on its own timeout
                logger.warning("job %s: instance %s rescaled away: %s failed: %s", self.job.id, k, call, exc)
            if future is not None and self.cluster_gone() is None:
                try:
                    future.release()
                except Exception:
                    pass

    def stop_instances(self, keys, timeout: float) -> None:
        """Ask the instances ``keys`` to stop, all at once; wait ``timeout`` seconds at most in all."""
        calls = []
        for k in keys:
            try:
                calls.append(self.job.actors[k].stop())
            except Exception:           # its worker is already gone
                pass
        deadline = time.time() + timeout
        for c in calls:
            try:
                c.result(timeout=max(deadline - time.time(), 0.05))
            except Exception:
                pass

    def forget(self, keys=None) -> None:
        """Drop the job's references to the actors ``keys`` (all by default)."""
        job = self.job
        reachable = self.cluster_gone() is None      # releasing a future needs its scheduler
        for k in (list(job.actors) if keys is None else keys):
            a, f = job.actors.pop(k, None), job._futures.pop(k, None)
            if f is not None and reachable:
                try:
                    f.release()
                except Exception:
                    pass
            if hasattr(a, "_future"):
                a._future = None

    def workers(self, workers) -> None:
        """See :meth:`streamlb.Job.release_workers`."""
        job = self.job
        workers = set(workers)
        keys = [k for k, w in job.workers_of.items() if w in workers and k in job.actors]
        if not keys:
            return
        self.released.update(workers & {job.workers_of[k] for k in keys})
        timeout = config.seconds("stop-timeout")
        deadline = time.time() + timeout
        for k in keys:                  # their load windows stay in Job.metrics()
            try:
                job._results.retired_metrics.extend(job.actors[k].metrics().result(
                    timeout=max(deadline - time.time(), 0.05)))
            except Exception:
                pass
        self.actors(keys, timeout=max(deadline - time.time(), 0.05))
        logger.info("job %s (%s): released %d instances on retiring workers %s", job.id, job.status,
                    len(keys), ", ".join(sorted(self.released)))

    def reason(self, operator: str) -> str:
        """Why the state of ``operator`` can no longer be read."""
        job = self.job
        if self.released:
            why = (f"its workers are gone: the instances on {', '.join(sorted(self.released))} were released "
                   f"when those workers retired after the job {_ENDED.get(job.status, job.status)}")
        elif self.cluster_gone():
            why = f"its workers are gone ({self.cluster_gone()})"
        else:
            why = "it was stopped, which released its instances"
        return (f"job {job.id}: the state of {operator!r} cannot be read: {why}. Read results before "
                "stopping the job or closing or scaling down its cluster (see docs/reconfiguration.md)")

    def close_client(self, timeout: float) -> None:
        """Close the client and cluster ``run`` started, waiting ``timeout`` seconds at most each."""
        job = self.job
        try:
            if job.client.status not in ("closed", "closing"):
                job.client.close(timeout=timeout)
        except Exception:
            pass
        if job.cluster is not None:
            try:
                job.cluster.close(timeout=timeout)
            except Exception:
                pass
