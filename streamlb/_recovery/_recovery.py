"""Recover a checkpointed job from a lost worker.

A Dask actor dies with its worker (a crash, SIGKILL, OOM, a nanny restart). The driver
notices it in two ways: an instance cannot be reached or reports that it could not send to
a peer, or the scheduler no longer lists a worker that held instances. It then restores the
whole job from the latest complete checkpoint:

1. stop the instances still alive and drop every actor (their outputs after the checkpoint
   are discarded, each by its sink's committer: staged Parquet files removed, staged list
   items dropped);
2. wait for a migration in flight to give up (its actors are gone) and start none;
3. re-create every instance on the workers the scheduler has now (workers that joined
   count), with the checkpoint's routing tables and parallelism, commit what the
   checkpoint sealed that is still not committed (a Kafka transaction that a lost worker
   never committed is written again from what the checkpoint kept:
   :func:`streamlb._recovery._restore.resume_outputs`), and install each key group's
   state from the checkpoint's files;
4. start the sources from the positions they had emitted at the barrier: every record after
   it is replayed, so state and committed outputs hold each record exactly once.

With no complete checkpoint yet, the job restarts from the beginning (empty state, sources
from their first row). ``restart_attempts`` bounds how many times; beyond it the job fails
with an error naming the lost worker and the last checkpoint.
"""
from __future__ import annotations

import logging
import threading
import time

from .. import config
from ..exceptions import JobFailedError, KeyTypeError, PipelineError, SchemaError, UserFunctionError
from ..routing import RoutingTable

logger = logging.getLogger("streamlb.checkpoint")

# errors that are the records' or the user's, never a lost worker's: no grace period
_OWN_FAULT = (UserFunctionError, PipelineError, SchemaError, KeyTypeError)


class Recovery:
    """The recoveries of one checkpointed :class:`~streamlb.Job`."""

    def __init__(self, job, attempts: int | None = None, grace: float = 5.0) -> None:
        self.job = job
        self.attempts = int(config.get("checkpoint.restart-attempts", attempts))
        if self.attempts < 0:
            raise PipelineError(f"restart_attempts must be >= 0, got {attempts!r}")
        self.grace = grace
        self.count = 0
        self._lock = threading.Lock()

    def lost_workers(self) -> list[str]:
        """Workers holding instances of the job that the scheduler no longer lists."""
        from .._placement import cluster_workers

        live = set(cluster_workers(self.job.client))
        return sorted({w for w in self.job.workers_of.values() if w not in live})

    def check(self) -> bool:
        """Recover now if a worker holding instances left; True if it did."""
        if self.job.status != "running":
            return False
        lost = self.lost_workers()
        if not lost:
            return False
        self.recover(lost, None)
        return True

    def handle(self, err: BaseException) -> bool:
        """An instance failed or could not be reached: if that is because a worker was lost
        (the scheduler may take a moment to tell), recover and return True."""
        deadline = time.time() + (0.0 if isinstance(err, _OWN_FAULT) else self.grace)
        while True:
            lost = self.lost_workers()
            if lost:
                self.recover(lost, err)
                return True
            if time.time() >= deadline:
                return False
            time.sleep(0.1)

    def recover(self, lost: list[str], err: BaseException | None) -> None:
        job = self.job
        ckpt = job.checkpointer
        with self._lock, job.topology_lock:
            if job.status != "running" or not set(lost) & set(job.workers_of.values()):
                return              # another thread recovered meanwhile
            names = sorted({job.plan.stages[s].name for s, _ in job.actors if job.workers_of.get((s, _)) in lost})
            last = f"checkpoint {ckpt.completed_id} in {ckpt.last_base}" if ckpt.last else "no complete checkpoint"
            if self.count >= self.attempts:
                error = JobFailedError(
                    f"job {job.id}: worker {lost[0]} (instances of {', '.join(names)}) was lost after "
                    f"{self.count} recoveries (restart_attempts={self.attempts}); last complete checkpoint: {last}")
                if err is not None:
                    error.__cause__ = err
                job.status, job.error = "failed", error
                self._drop_actors()
                raise error
            self.count += 1
            t0 = time.time()
            logger.warning("job %s: worker %s lost (instances of %s); restoring %s (recovery %d of %d)",
                           job.id, ", ".join(lost), ", ".join(names), last, self.count, self.attempts)
            keyed = [st.name for st in job.plan.stages if st.id in job.tables]
            job._migrations.lose(lost)      # a move in flight on them fails at once
            self._drop_actors()
            paused = True
            try:
                job._migrations.pause_moves(keyed, config.seconds("migration.timeout"))
            except Exception as exc:        # a move that will not give up: go on regardless
                logger.warning("job %s: a migration in flight did not end: %s", job.id, exc)
                paused = False
            try:
                discarded = ckpt.discard_outputs()
                restored = (ckpt.last, ckpt.last_base) if ckpt.last is not None else None
                self._tables(restored)
                from .._placement import cluster_workers

                workers = sorted(cluster_workers(job.client))
                if not workers:
                    job.error = JobFailedError(f"job {job.id}: worker {', '.join(lost)} lost and no worker is left "
                                               f"to restore {last} on: every worker of the cluster is gone")
                    job.status = "failed"
                    raise job.error
                run = max(job.runs.values(), default=0) + 1
                job._deploy(workers, restored, fresh_clock=False, run=run)
                topology = job.topology()
                topology["reset"] = True
                job._migrations.update_topology(topology)
                ckpt.force_full = True
                job._start(restored, fresh_clock=False)
            finally:
                if paused:
                    job._migrations.resume_moves(keyed)
            done = time.time()
            replayed = 0
            if restored is not None:
                replayed = sum(p.get("records_out", 0) for ps in restored[0]["sources"].values() for p in ps)
            job._reconfigs.append({
                "kind": "recovery", "lost_workers": lost, "operators": names,
                "checkpoint": ckpt.completed_id if restored else None, "attempt": self.count,
                "started": t0, "completed": done, "time_to_resume": done - t0,
                "restored_keys": restored[0]["keys"] if restored else 0,
                "resumed_from_records": replayed, "discarded_output_segments": discarded,
                "error": None if err is None else f"{type(err).__name__}: {err}"[:500],
            })
            logger.warning("job %s: resumed from %s in %.2f s on %d workers", job.id, last, done - t0,
                           len(set(job.workers_of.values())))

    def _tables(self, restored) -> None:
        """Routing tables for the new instances: the checkpoint's (and its parallelism),
        or the initial ones; numbered after every epoch so far."""
        from ._restore import restored_tables

        job = self.job
        if restored is not None:
            for st in job.plan.stages:
                op = restored[0]["operators"].get(st.name)
                if op is not None:
                    st.parallelism = int(op["parallelism"])
        fresh = restored_tables(restored[0], job.plan.stages) if restored is not None else {}
        for st in job.plan.stages:
            if st.id not in job.tables:
                continue
            epoch = job._migrations.routing(st.name).epoch + 1
            t = fresh.get(st.id) or job.first_tables.get(st.id)
            if t is None or t.parallelism != st.parallelism:
                t = RoutingTable.initial(job.key_groups, st.parallelism)
            job.tables[st.id] = RoutingTable(t.owners, st.parallelism, epoch)

    def _drop_actors(self) -> None:
        """Stop every instance still alive and let go of every actor."""
        self.job._release_actors(timeout=5)
