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

A lost worker is one fault among others (:mod:`._faults`): an instance that could not
deliver to a peer (a network partition), a worker silent for ``streamlb.fault.heartbeat-timeout``
(frozen), a sink write that may pass. Each starts the same recovery; the new instances go
on the workers that answer the driver and reach each other (:func:`._reach.reachable`), so a
partitioned or frozen worker is left out. A fault during a recovery (another worker lost
while the instances are re-created) is one more attempt, and the job fails only when the
attempts are used up, with ``status`` ``"failed"`` and its ``error`` what ``wait()`` raises.
"""
from __future__ import annotations

import logging
import threading
import time

from .. import config
from ..exceptions import InstanceUnresponsiveError, JobFailedError, PipelineError, SinkWriteError
from ..routing import RoutingTable
from ._faults import OWN_FAULT, FaultLog, describe, kind_of

logger = logging.getLogger("streamlb.checkpoint")


class Recovery:
    """The recoveries of one checkpointed :class:`~streamlb.Job`."""

    def __init__(self, job, attempts: int | None = None, grace: float = 5.0) -> None:
        self.job = job
        self.attempts = int(config.get("checkpoint.restart-attempts", attempts))
        if self.attempts < 0:
            raise PipelineError(f"restart_attempts must be >= 0, got {attempts!r}")
        self.grace = grace
        self.count = 0              # recoveries over the job's life
        self.streak = 0             # of them, since a checkpoint last completed: what attempts bound
        self.faults = FaultLog()
        self._lock = threading.Lock()
        self._heard: dict[str, tuple[float, float]] = {}    # worker -> (its last_seen, when that changed here)
        self._deployed: tuple = ()          # the workers the last attempt deployed on

    def progressed(self) -> None:
        """A checkpoint completed: the job makes progress, so the recoveries before it no
        longer count against ``restart_attempts`` (which bounds a crash loop, not a job's
        life: an unbounded job that loses a worker now and then lives on)."""
        self.streak = 0

    # -- detection ----------------------------------------------------------------------------------
    def lost_workers(self) -> list[str]:
        """Workers holding instances of the job that the scheduler no longer lists."""
        return self.faulty()[0]

    def faulty(self) -> tuple[list[str], dict[str, float]]:
        """Workers holding instances of the job that the scheduler no longer lists, and
        those it lists but heard no heartbeat from for ``streamlb.fault.heartbeat-timeout``
        (worker -> seconds silent, timed on this clock: no skew with the scheduler's)."""
        from .._placement import cluster_workers

        live = cluster_workers(self.job.client)
        now = time.monotonic()
        mine = set(self.job.workers_of.values())
        limit = config.seconds("fault.heartbeat-timeout")
        silent = {}
        for w in mine & set(live):
            seen = live[w].get("last_seen")
            last = self._heard.get(w)
            if last is None or last[0] != seen:
                self._heard[w] = (seen, now)
            elif now - last[1] > limit:
                silent[w] = now - last[1]
        return sorted(w for w in mine if w not in live), silent

    def check(self) -> bool:
        """Recover now if a worker holding instances left or went silent; True if it did."""
        if self.job.status != "running":
            return False
        lost, silent = self.faulty()
        if lost:
            self.recover(lost, None)
            return True
        if silent:
            w, s = max(silent.items(), key=lambda x: x[1])
            names = self._instances_on([w])
            err = InstanceUnresponsiveError(
                f"job {self.job.id}: worker {w} (instances of {', '.join(names)}) sent the scheduler no heartbeat "
                f"for {s:.1f} s (streamlb.fault.heartbeat-timeout="
                f"{config.seconds('fault.heartbeat-timeout'):g}s): frozen, stopped or stuck", names[0] if names else "",
                w, s)
            self.recover([], err, suspects=sorted(silent))
            return True
        return False

    def handle(self, err: BaseException, suspects=(), since: int | None = None) -> bool:
        """An instance failed or could not be reached: if that is a fault (a lost worker, the
        scheduler may take a moment to tell; an unreachable peer; a worker gone silent),
        recover and return True. ``since``: the recovery count when the failure was seen
        (a recovery since then already answered it)."""
        kind = kind_of(err)
        if kind is None and isinstance(err, (*OWN_FAULT, SinkWriteError)):
            return False                    # the user's, or a write that retrying cannot help: fails at once
        deadline = time.time() + self.grace
        while True:
            if since is not None and self.count > since and self.job.status == "running":
                return True                 # another thread recovered meanwhile
            lost = self.lost_workers()
            if lost:
                self.recover(lost, err)
                return True
            if kind is not None and kind != "instance unreachable":
                break                       # a fault of its own kind: no need to wait for a loss
            if time.time() >= deadline:
                break
            time.sleep(0.1)
        if kind is None:
            return False
        self.recover([], err, suspects=list(suspects) or self._suspects(err))
        return True

    def _suspects(self, err) -> list[str]:
        """The worker a fault points to, if it names one the job uses."""
        address = getattr(err, "address", "")
        return [address] if address in set(self.job.workers_of.values()) else []

    def _instances_on(self, workers) -> list[str]:
        job = self.job
        return sorted({job.plan.stages[s].name for s, i in job.actors if job.workers_of.get((s, i)) in workers})

    # -- the recovery -------------------------------------------------------------------------------
    def recover(self, lost: list[str], err: BaseException | None, suspects=()) -> None:
        """Restore the job from its latest complete checkpoint after ``lost`` workers left
        (``err``: the failure that told, if any; ``suspects``: listed workers to leave out,
        frozen or cut off). A fault during it is another attempt; when the attempts are used
        up the job fails: its status ``"failed"``, its error raised."""
        job = self.job
        with self._lock, job.topology_lock:
            if job.status != "running" or (lost and not set(lost) & set(job.workers_of.values())):
                return              # another thread recovered meanwhile
            if suspects and not lost and not set(suspects) & set(job.workers_of.values()):
                return              # the same: a recovery left them out (two threads saw the fault)
            kind = kind_of(err) or "worker lost"
            if lost:
                kind = "worker lost"
            culprits = list(lost) or list(suspects)
            names = self._instances_on(culprits) or sorted({st.name for st in job.plan.stages})
            while True:
                if self.streak >= self.attempts:
                    self._give_up(kind, culprits, names, err)
                self.count += 1
                self.streak += 1
                row = self.faults.add(kind, culprits, err, "recovering", self.streak,
                                      job.checkpointer.completed_id or None)
                try:
                    self._restore(lost, suspects, names, err, kind)
                    row["action"] = "recovered"
                    return
                except JobFailedError as exc:
                    row["action"] = "failed"
                    raise exc
                except Exception as exc:        # a fault while recovering: one more attempt
                    from .._placement import cluster_workers

                    live = set(cluster_workers(job.client))
                    again = sorted(w for w in set(job.workers_of.values()) | set(self._deployed) if w not in live)
                    row["action"] = f"attempt failed: {describe(exc)}"
                    logger.warning("job %s: recovery %d of %d failed (%s: %s)%s", job.id, self.streak,
                                   self.attempts, type(exc).__name__, exc,
                                   f"; worker {', '.join(again)} lost meanwhile" if again else "")
                    kind = "worker lost" if again else (kind_of(exc) or kind)
                    lost = sorted(set(lost) | set(again))
                    culprits = sorted(set(culprits) | set(again))
                    err = exc

    def _give_up(self, kind: str, culprits: list[str], names: list[str], err) -> None:
        """The attempts are used up: the job fails, saying what was lost, when, and how to resume."""
        job = self.job
        ckpt = job.checkpointer
        last = f"checkpoint {ckpt.completed_id} in {ckpt.last_base}" if ckpt.last else "no complete checkpoint"
        what = {"worker lost": "was lost", "peer unreachable": "could not be reached by its peers",
                "worker unresponsive": "stopped answering", "sink write": "could not write its output",
                "instance unreachable": "could not be reached"}[kind]
        resume = (f"; resume it with streamlb.run(<the same pipeline>, checkpoint={ckpt.url!r}) (a run on the same "
                  f"checkpoint directory starts from its latest complete checkpoint)" if ckpt.url else "")
        error = JobFailedError(
            f"job {job.id}: worker {', '.join(culprits) or '?'} (instances of {', '.join(names)}) {what} at "
            f"{time.strftime('%H:%M:%S')} after {self.streak} recoveries with no checkpoint completed between them "
            f"(restart_attempts={self.attempts}; {self.count} in the job's life); "
            f"last complete checkpoint: {last}{resume}")
        if err is not None:
            error.__cause__ = err
        self.faults.add(kind, culprits, err, "failed", self.streak, ckpt.completed_id or None)
        job.status, job.error = "failed", error
        self._drop_actors()
        raise error

    def _restore(self, lost: list[str], suspects, names: list[str], err, kind: str) -> None:
        job = self.job
        ckpt = job.checkpointer
        t0 = time.time()
        last = f"checkpoint {ckpt.completed_id} in {ckpt.last_base}" if ckpt.last else "no complete checkpoint"
        culprit = ", ".join(list(lost) or list(suspects)) or "?"
        logger.warning("job %s: %s: %s (instances of %s)%s; restoring %s (recovery %d of %d)", job.id, kind, culprit,
                       ", ".join(names), f" [{describe(err)}]" if err is not None and kind != "worker lost" else "",
                       last, self.streak, self.attempts)
        keyed = [st.name for st in job.plan.stages if st.id in job.tables]
        job._migrations.lose(list(lost) + list(suspects))      # a move in flight on them fails at once
        current = set(job.workers_of.values())     # a tie between two sides of a partition: the busier
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
            workers, cut = self._workers(lost, suspects, kind, current)
            if not workers:
                job.error = JobFailedError(f"job {job.id}: worker {culprit} {kind} and no worker is left to restore "
                                           f"{last} on: {cut or 'every worker of the cluster is gone'}")
                job.status = "failed"
                raise job.error
            self._deployed = tuple(workers)
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
            "kind": "recovery", "fault": kind, "lost_workers": list(lost), "left_out": sorted(set(suspects)),
            "operators": names, "checkpoint": ckpt.completed_id if restored else None, "attempt": self.count,
            "started": t0, "completed": done, "time_to_resume": done - t0,
            "restored_keys": restored[0]["keys"] if restored else 0,
            "resumed_from_records": replayed, "discarded_output_segments": discarded,
            "error": None if err is None else describe(err),
        })
        logger.warning("job %s: resumed from %s in %.2f s on %d workers", job.id, last, done - t0,
                       len(set(job.workers_of.values())))

    def _workers(self, lost, suspects, kind: str, current=()) -> tuple[list[str], str]:
        """Where the new instances go: the listed workers, less those lost or left out; after
        a fault other than a plain loss, only those that answer and reach each other. Also
        what was cut off, for an error."""
        from .._placement import cluster_workers

        workers = sorted(w for w in cluster_workers(self.job.client) if w not in set(lost) | set(suspects))
        if kind == "worker lost" and not suspects or len(workers) < 1:
            return workers, ""
        from ._reach import reachable

        chosen, cut = reachable(self.job.client, workers, config.seconds("fault.probe-timeout"), current)
        if len(chosen) < len(workers):
            logger.warning("job %s: restoring on %s only: %s", self.job.id, ", ".join(chosen) or "no worker",
                           "; ".join(f"{w} cannot reach {', '.join(o) or 'the driver'}" for w, o in cut.items() if o
                                     or w not in chosen))
        return chosen, "; ".join(f"{w} cannot reach {', '.join(o)}" for w, o in cut.items() if o)

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
